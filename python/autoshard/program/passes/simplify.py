"""Exact simplifications of a lowered local graph (program/lowering.py), run after tracing and again
after the overlap passes. Every node left is a dispatched op, and its Python line runs every
step, so ops that compute nothing are removed:

- views that change nothing (same shape and strides as their input: DTensor's to_local /
  from_local leave one per tensor per use, ~2 per parameter per step) and detaches (the
  graphs run without autograd);
- chains of views that end where they began (a weight transposed for the matmul and back
  for its gradient: ``t(t(w))``; a bucket's slice reshaped and flattened again): the chain's
  result is its source, the same storage, offset, shape and strides;
- ``pow(x, 1.0)`` (what the backward of ``x ** 2`` leaves), which returns ``x`` exactly;
- a constant's fresh copy that nothing reads but its own in-place ``detach_`` (the tensors
  DTensor builds while tracing under compile_on_one_rank, one per mesh coordinate read).
A graph output that was such a node becomes its source.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from autoshard.program.graph_nodes import op_name, tensor_val

_IDENTITY_CANDIDATES = ("view", "reshape", "_unsafe_view", "alias", "detach")
# ops whose result always aliases their (first) input
_VIEWS = {
    "view",
    "_unsafe_view",
    "alias",
    "t",
    "transpose",
    "permute",
    "expand",
    "squeeze",
    "unsqueeze",
    "select",
    "slice",
    "as_strided",
    "reshape",
}


def simplify(gm: fx.GraphModule) -> None:
    for n in list(gm.graph.nodes):
        src = _equivalent_source(n)
        if src is not None:
            n.replace_all_uses_with(src)
            gm.graph.erase_node(n)
        elif _unread_fresh_copy(n):
            detach = next(iter(n.users))
            gm.graph.erase_node(detach)
            gm.graph.erase_node(n)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _unread_fresh_copy(n: fx.Node) -> bool:
    if op_name(n) != "lift_fresh_copy" or len(n.users) != 1:
        return False
    (user,) = n.users
    return op_name(user) == "detach_" and not user.users


def _equivalent_source(n: fx.Node) -> fx.Node | None:
    """An earlier node holding exactly ``n``'s value (so ``n`` can go), else None."""
    name = op_name(n)
    if name is None or not n.args or not isinstance(n.args[0], fx.Node):
        return None
    val, src = tensor_val(n), tensor_val(n.args[0])
    if val is None or src is None:
        return None
    if name == "detach":
        return n.args[0]
    if (
        name == "pow"
        and len(n.args) > 1
        and n.args[1] == 1
        and val.dtype == src.dtype
        and val.shape == src.shape
    ):
        return n.args[0]
    if name not in _VIEWS:
        return None
    # walk back through views to the earliest node this view is an exact alias of
    found, cur = None, n
    while op_name(cur) in _VIEWS or cur.target is operator.getitem:
        prev = cur.args[0]
        pv = tensor_val(prev)
        if pv is None:
            break
        if _same_view(pv, val):
            found = prev
        cur = prev
        if not isinstance(cur, fx.Node):
            break
    return found


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.storage_offset() == b.storage_offset()
        and StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
    )
