"""FlexAttention in the traced step: its block mask as a model input, its higher-order ops as
graph nodes every stage can read, and its dense math on CPU.

``torch.nn.attention.flex_attention`` traces to two higher-order ops (HOPs):
``flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options, score_mod_buffers,
mask_mod_buffers) -> (out, logsumexp, max_scores)`` and ``flex_attention_backward(q, k, v,
out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph, block_mask, scale,
kernel_options, score_mod_buffers, mask_mod_buffers) -> (dq, dk, dv, score_mod_buffer_grads)``.
``block_mask`` is a tuple ``(Q_LEN, KV_LEN, kv_num_blocks, kv_indices, full_kv_num_blocks,
full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, Q_BLOCK_SIZE,
KV_BLOCK_SIZE, mask_mod)`` (``BlockMask.as_tuple()``). The score / mask functions reach the
joint graph as ``get_attr`` nodes of sub-GraphModules, and ``kernel_options`` as a dict: no
planner input, rule or runtime slot takes either. So ``fold_flex_attention`` rewrites each HOP
node into a call of a ``FlexAttentionCall`` that holds them: the node keeps the HOP's argument
positions, with each sub-graph replaced by its role's name (``"score_mod"``) and
``kernel_options`` by None, so its tensor arguments are exactly the HOP's, in its order (q, k,
v, ..., the block mask's tensors, the buffers), and the call puts the graphs and options back.
Calling it on local shards calls the HOP (``make_fx`` of the per-rank program records the HOP
itself, with its sub-graphs, which inductor compiles into its kernels under ``compile=True``).

Every tensor of a BlockMask (and of the closure of its ``mask_mod``) is a graph input:
``register_block_mask_pytree`` registers BlockMask as a pytree with torch's own
flatten/unflatten (torch 2.13 defines them and registers nothing), so Dynamo's export and the
input binding accept it as they accept a dict of tensors.

On CPU, torch 2.13's ``flex_attention`` refuses inputs that require grad ("FlexAttention
does not support backward on CPU"), a check of its Python front end only: the HOPs have a
dense implementation (``sdpa_dense`` / ``sdpa_dense_backward``: scores materialised, masked by
``mask_mod``, softmax), which is what runs when the program runs on CPU. The trace lifts the
check (it runs on fake tensors, on CPU when the host has no GPU), and
``dense_flex_attention_on_cpu`` lifts it for a model run eagerly on CPU, e.g. the
single-device reference a parallel CPU run is compared with.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Iterator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

_FORWARD = "flex_attention"
_BACKWARD = "flex_attention_backward"

# the HOP's argument positions that hold sub-graphs, with the role names they are replaced by
_GRAPH_ARGS = {_FORWARD: {3: "score_mod"}, _BACKWARD: {7: "fw_graph", 8: "joint_graph"}}
_BLOCK_MASK_ARG = {_FORWARD: 4, _BACKWARD: 9}
_KERNEL_OPTIONS_ARG = {_FORWARD: 6, _BACKWARD: 11}
_MASK_MOD = "mask_mod"  # the last entry of the block mask tuple


def register_block_mask_pytree() -> None:
    """BlockMask as a pytree node (its tensors and the tensors its ``mask_mod`` closes over
    as leaves); once per process, and never where torch already registers it."""
    from torch.nn.attention.flex_attention import BlockMask

    if BlockMask in pytree.SUPPORTED_NODES:
        return
    pytree.register_pytree_node(
        BlockMask,
        BlockMask._flatten,
        BlockMask._unflatten,
        flatten_with_keys_fn=BlockMask._flatten_with_keys,
        serialized_type_name="torch.nn.attention.flex_attention.BlockMask",
    )


def check_block_mask_inputs(inputs: Any) -> None:
    """Refuses a BlockMask input whose ``mask_mod`` closes over tensors (torchtitan's
    packed-document masks): torch flattens such a mask with its closure tensors as leaves,
    except while Dynamo traces (``_extract_callable_pytree`` is skipped when compiling), so the
    exported graph would number its inputs differently from the call's and take one input's
    tensor for another's."""
    from torch.nn.attention.flex_attention import BlockMask

    masks = [x for x in pytree.tree_leaves(inputs, is_leaf=lambda v: isinstance(v, BlockMask))]
    for mask in masks:
        if not isinstance(mask, BlockMask):
            continue
        leaves, _ = mask._flatten()
        own = [a for a in BlockMask._TENSOR_ATTRS if getattr(mask, a) is not None]
        if len(leaves) > len(own):
            raise NotImplementedError(
                "autoshard: a BlockMask input whose mask_mod captures tensors (e.g. a packed-"
                "document mask) is not supported yet: torch flattens it differently while "
                "tracing. Use a mask_mod without captured tensors (causal, sliding window), "
                "or build the mask inside the model's forward"
            )


@contextlib.contextmanager
def cpu_backward_check_lifted() -> Iterator[None]:
    """torch's front-end refusal of FlexAttention inputs that require grad on CPU, lifted:
    the HOPs then run (or trace) their dense math."""
    import torch.nn.attention.flex_attention as flex

    checked = flex._validate_device

    def validate_device(query, key, value):
        if query.device.type == "cpu":
            return  # the dense HOP implementations serve forward and backward
        checked(query, key, value)

    flex._validate_device = validate_device
    try:
        yield
    finally:
        flex._validate_device = checked


@contextlib.contextmanager
def dense_flex_attention_on_cpu() -> Iterator[None]:
    """Run FlexAttention with autograd on CPU as its dense math: the front end's CPU check
    lifted, and ``torch.compile``'d code run eagerly (models compile ``flex_attention``, as
    torchtitan does, and inductor has no CPU FlexAttention backward). The parallel module
    runs the same math on CPU, so a single-device reference run under this context is the
    one to compare it with."""
    with cpu_backward_check_lifted(), torch.compiler.set_stance("force_eager"):
        yield


class FlexAttentionCall:
    """The target of a folded FlexAttention node: calls the HOP with the node's arguments,
    its sub-graphs and kernel options put back where the node holds role names and None."""

    def __init__(self, hop_name: str, graphs: dict[str, fx.GraphModule], kernel_options: dict):
        self.hop_name = hop_name
        self.graphs = graphs
        self.kernel_options = kernel_options
        self.__name__ = self.__qualname__ = hop_name
        self.__module__ = __name__

    def __str__(self) -> str:  # the op name the planner's rules and the local-op registry use
        return f"higher_order.{self.hop_name}"

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:  # layers whose calls differ in graph names only
        return (
            isinstance(other, FlexAttentionCall)
            and self.hop_name == other.hop_name
            and self.kernel_options == other.kernel_options
            and self.graphs.keys() == other.graphs.keys()
            and all(self.graphs[k].code == other.graphs[k].code for k in self.graphs)
        )

    def __hash__(self) -> int:
        return hash((self.hop_name, tuple(sorted(self.graphs))))

    def __call__(self, *args: Any) -> Any:
        hop = getattr(torch.ops.higher_order, self.hop_name)
        return hop(*self.hop_args(args))

    def hop_args(self, args: tuple) -> list:
        """The HOP's arguments from the node's: role names back to graphs, options back."""
        full = list(args)
        for pos, role in _GRAPH_ARGS[self.hop_name].items():
            full[pos] = self.graphs[role]
        mask_at = _BLOCK_MASK_ARG[self.hop_name]
        full[mask_at] = (*full[mask_at][:-1], self.graphs[_MASK_MOD])
        full[_KERNEL_OPTIONS_ARG[self.hop_name]] = dict(self.kernel_options)
        return full


def is_flex_attention_call(target: Any) -> bool:
    return isinstance(target, FlexAttentionCall)


def fold_flex_attention(gm: fx.GraphModule) -> int:
    """Rewrites every FlexAttention HOP node of ``gm`` into a ``FlexAttentionCall`` node (the
    module docstring) and drops the ``get_attr`` nodes of its sub-graphs; returns how many
    nodes it folded."""
    hops = {getattr(torch.ops.higher_order, name, None): name for name in (_FORWARD, _BACKWARD)}
    folded = 0
    for node in list(gm.graph.nodes):
        name = hops.get(node.target) if node.op == "call_function" else None
        if name is None:
            continue
        _check_no_buffer_gradients(node, name)
        args = list(node.args)
        graphs = {}
        for pos, role in _GRAPH_ARGS[name].items():
            graphs[role], args[pos] = _subgraph(gm, args[pos]), role
        mask_at = _BLOCK_MASK_ARG[name]
        block_mask = tuple(args[mask_at])
        graphs[_MASK_MOD] = _subgraph(gm, block_mask[-1])
        args[mask_at] = (*block_mask[:-1], _MASK_MOD)
        options_at = _KERNEL_OPTIONS_ARG[name]
        kernel_options, args[options_at] = dict(args[options_at] or {}), None
        node.target = FlexAttentionCall(name, graphs, kernel_options)
        node.args = tuple(args)
        folded += 1
    if folded:
        for node in list(gm.graph.find_nodes(op="get_attr")):
            if not node.users and isinstance(getattr(gm, node.target, None), fx.GraphModule):
                gm.graph.erase_node(node)
        gm.graph.lint()
        gm.recompile()
    return folded


def _subgraph(gm: fx.GraphModule, ref: Any) -> fx.GraphModule:
    if isinstance(ref, fx.Node) and ref.op == "get_attr":
        return getattr(gm, ref.target)
    if isinstance(ref, fx.GraphModule):
        return ref
    raise NotImplementedError(f"autoshard: a FlexAttention sub-graph argument is {ref!r}")


def _check_no_buffer_gradients(node: fx.Node, name: str) -> None:
    """A score_mod whose captured tensors need gradients (a learned bias) gets them from the
    backward HOP's fourth output, which no rule lays out yet."""
    if name != _BACKWARD:
        return
    for user in node.users:
        if user.target is operator.getitem and user.args[1] == 3 and user.users:
            raise NotImplementedError(
                "autoshard: a FlexAttention score_mod whose captured tensors require grad "
                f"(node {node.name}) is not supported yet: pass them without requires_grad, "
                "or compute the bias outside the score_mod"
            )
