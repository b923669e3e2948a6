"""What the lowered program's passes ask of a node: which op it calls, its value, whether it
is a collective or a wait and which wait belongs to which collective. Shared by lowering and
every pass (passes/), so that they agree on what a collective is."""

from __future__ import annotations

import torch
import torch.fx as fx

OUTSIDE = "<graph outputs>"


COLLECTIVE_OPS = {
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_reduce",
    "all_to_all_single",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_reduce_coalesced",
    "all_reduce_",
}  # all_reduce_: in place, on a buffer nothing else reads


def op_name(node: fx.Node) -> str | None:
    """The ATen-style name of a call to an operator overload ("all_reduce", "view"), else
    None (placeholders, getitem, plain Python functions)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return node.target._schema.name.split("::")[-1]


def tensor_val(n) -> torch.Tensor | None:
    """The fake tensor a traced node recorded as its value, or None (not a node, not a
    tensor)."""
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def is_functional_c10d(node: fx.Node) -> bool:
    return op_name(node) is not None and node.target.namespace == "_c10d_functional"


def is_collective(node: fx.Node) -> bool:
    return is_functional_c10d(node) and op_name(node) in COLLECTIVE_OPS


def is_wait(node: fx.Node) -> bool:
    return is_functional_c10d(node) and op_name(node) == "wait_tensor"


def wait_of(node: fx.Node) -> fx.Node | None:
    """The wait of collective ``node`` when that wait is its only user (the form the passes
    move and merge), else None."""
    if not is_collective(node) or len(node.users) != 1:
        return None
    w = next(iter(node.users))
    return w if is_wait(w) else None


PARAM_KEY = "autoshard_param"  # placeholder meta: the parameter (FQN) it holds a shard of


def strip_views(n: fx.Node) -> fx.Node:
    while op_name(n) in ("view", "_unsafe_view", "alias", "detach"):
        n = n.args[0]
    return n
