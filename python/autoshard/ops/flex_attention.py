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
input binding accept it as they accept a dict of tensors. The values a ``mask_mod`` function
(or ``functools.partial``) captures, such as the document table of torchtitan's
packed-document mask, are leaves of that flattening everywhere but under Dynamo, whose
capture holds them as constants; ``lift_mask_closure_inputs`` makes them inputs of the
captured graph at the positions a call's flattening gives them. A tensor a mask reaches
otherwise (an attribute of a callable object, a global) is in no flattening: the trace
refuses it naming the fix (tracer.explain_trace_error).

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
_SCORE_BUFFERS_ARG = {_FORWARD: 7, _BACKWARD: 12}
_MASK_BUFFERS_ARG = {_FORWARD: 8, _BACKWARD: 13}
# the positions of the graphs that take a score: score_mod; fw_graph and the joint graph (True)
_SCORE_GRAPHS = {_FORWARD: {3: False}, _BACKWARD: {7: False, 8: True}}


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


def mask_closure_positions(inputs: Any) -> list[int]:
    """The flat positions (``pytree.tree_flatten(inputs)`` order) of the values the
    ``mask_mod`` of a BlockMask among ``inputs`` closes over (torchtitan's packed-document
    tables); empty where no mask captures anything."""
    from torch.nn.attention.flex_attention import BlockMask

    positions, at = [], 0
    for leaf in pytree.tree_leaves(inputs, is_leaf=lambda v: isinstance(v, BlockMask)):
        if not isinstance(leaf, BlockMask):
            at += 1
            continue
        leaves, _ = leaf._flatten()
        own = sum(getattr(leaf, a) is not None for a in BlockMask._TENSOR_ATTRS)
        positions += range(at + own, at + len(leaves))
        at += len(leaves)
    return positions


_CLOSURE_VALUE_TYPES = (torch.Tensor, int, float, bool, str, type(None))


def check_mask_closure_values(inputs: Any) -> None:
    """Refuses a value a BlockMask's ``mask_mod`` captures that no graph input can hold (a
    callable object, say, passed to ``and_masks``): torch flattens it as a leaf, which the
    export cannot trace."""
    flat = pytree.tree_leaves(inputs)
    for pos in mask_closure_positions(inputs):
        if not isinstance(flat[pos], _CLOSURE_VALUE_TYPES):
            raise NotImplementedError(
                "autoshard: a BlockMask input's mask_mod captures a "
                f"{type(flat[pos]).__name__} (flat input {pos}), which torch flattens as one "
                "value that no graph input can hold (a callable object, or a container torch "
                "cannot flatten). Make each mask_mod a function (or functools.partial) and "
                "capture tensors or Python scalars only, as torchtitan's document masks do"
            )


def lift_mask_closure_inputs(gm: fx.GraphModule, inputs: Any) -> None:
    """Makes the values a BlockMask's ``mask_mod`` closes over inputs of ``gm``, Dynamo's
    export capture of a call with ``inputs`` (``(args, kwargs)``), numbered as a call
    flattens them.

    torch flattens a BlockMask with its ``mask_mod``'s closure values as leaves, except
    while compiling (``_extract_callable_pytree``), so Dynamo's capture numbers its inputs
    without them and holds each captured tensor as a constant attribute of ``gm``: the
    sample's document table baked into the graph, and every later input shifted by one
    where a call (AOT's export, the parallel module) flattens the mask with them. Here each
    closure value becomes a placeholder at its flat position, the constant's uses read it,
    and ``gm`` takes its inputs by the call's flattening."""
    closure = set(mask_closure_positions(inputs))
    if not closure:
        return
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

    codegen = gm.graph._codegen
    flat, spec = pytree.tree_flatten(inputs)
    olds = list(gm.graph.find_nodes(op="placeholder"))
    if not isinstance(codegen, _PyTreeCodeGen) or len(olds) != len(flat) - len(closure):
        raise NotImplementedError(
            "autoshard: cannot bind the tensors a BlockMask's mask_mod captures to the "
            f"captured graph ({len(olds)} graph inputs for {len(flat)} flat inputs, "
            f"{len(closure)} of them captured by a mask_mod); pass the mask without "
            "captured tensors, or build it inside the model's forward"
        )
    constants: dict[int, list[fx.Node]] = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        value = getattr(gm, node.target, None)
        if isinstance(value, torch.Tensor):
            constants.setdefault(id(value), []).append(node)
    anchor = next(n for n in gm.graph.nodes if n.op != "placeholder")
    dynamo_inputs = iter(olds)
    for pos, leaf in enumerate(flat):
        if pos not in closure:
            anchor.prepend(next(dynamo_inputs))  # kept in order, before the new ones' uses
            continue
        with gm.graph.inserting_before(anchor):
            node = gm.graph.placeholder(f"mask_mod_closure_{pos}")
        if isinstance(leaf, torch.Tensor):
            node.meta["val"] = leaf
        for const in constants.get(id(leaf), []):
            const.replace_all_uses_with(node)
            gm.graph.erase_node(const)
            if not gm.graph.find_nodes(op="get_attr", target=const.target):
                delattr(gm, const.target)
    info = codegen.pytree_info
    codegen.pytree_info = _PyTreeInfo(info.orig_args, spec, info.out_spec)
    gm.graph.lint()
    gm.recompile()


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

    def call_at_positions(
        self,
        args: tuple,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        rebuild_blocks=None,
        block_masks: LocalBlockMasks | None = None,
        positions_key: Any = None,
    ) -> Any:
        """The call with its queries at global positions ``q_pos`` and its keys at
        ``k_pos`` (one per local index, any order): the mods see those positions as
        ``q_idx`` / ``kv_idx`` (a shard of a sequence-split call, or the head-tail order).
        ``rebuild_blocks`` (default: off the CPU, whose dense math reads ``mask_mod`` only)
        recomputes the block mask's tensors for these positions, which the GPU kernels read
        to skip blocks; ``block_masks`` keeps them for the calls that follow at the same
        positions, named by ``positions_key`` (hashable; None: not kept)."""
        full = at_positions(self.hop_name, self.hop_args(args), q_pos, k_pos)
        q, k = full[0], full[1]
        if rebuild_blocks is None:
            rebuild_blocks = q.device.type != "cpu"
        if rebuild_blocks:
            mask_at = _BLOCK_MASK_ARG[self.hop_name]
            buffers = full[_MASK_BUFFERS_ARG[self.hop_name]]
            if block_masks is None or positions_key is None:
                full[mask_at] = local_block_mask(full[mask_at], buffers, q, k)
            else:
                own = len(args[_MASK_BUFFERS_ARG[self.hop_name]])  # the model's, not the positions
                full[mask_at] = block_masks.get(
                    _mask_identity(self.graphs[_MASK_MOD]), full[mask_at], buffers, own, q, k,
                    positions_key,
                )  # fmt: skip
        out = getattr(torch.ops.higher_order, self.hop_name)(*full)
        if self.hop_name == _BACKWARD:  # no gradients for the positions
            out = (*out[:3], list(out[3])[: len(args[_SCORE_BUFFERS_ARG[_BACKWARD]])])
        return out

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


# ---- the mods at global positions (context parallelism) ------------------------------------
# The kernels call score_mod(score, b, h, q_idx, kv_idx, *buffers), the joint graph (score, b,
# h, q_idx, kv_idx, grad, *buffers) and mask_mod(b, h, q_idx, kv_idx, *buffers) with the LOCAL
# indices of the call's q and k. The wrappers below take two more buffers, the positions of
# the local queries and keys, and call the model's mods at those positions; passing them as
# buffers (not closure constants) keeps them inputs of the sub-graphs make_fx records.


def _score_at_positions(score_mod, n_own: int):
    def score_at_positions(score, b, h, q_idx, kv_idx, *buffers):
        q_pos, k_pos = buffers[n_own:]
        return score_mod(score, b, h, q_pos[q_idx], k_pos[kv_idx], *buffers[:n_own])

    return score_at_positions


def _joint_at_positions(joint_graph, n_own: int):
    def joint_at_positions(score, b, h, q_idx, kv_idx, grad, *buffers):
        q_pos, k_pos = buffers[n_own:]
        grads = joint_graph(score, b, h, q_pos[q_idx], k_pos[kv_idx], grad, *buffers[:n_own])
        return [*grads, None, None]  # the positions get no gradient (a list, as the vmap expects)

    return joint_at_positions


def _mask_at_positions(mask_mod, n_own: int):
    def mask_at_positions(b, h, q_idx, kv_idx, *buffers):
        q_pos, k_pos = buffers[n_own:]
        return mask_mod(b, h, q_pos[q_idx], k_pos[kv_idx], *buffers[:n_own])

    return mask_at_positions


def at_positions(hop_name: str, full: list, q_pos: torch.Tensor, k_pos: torch.Tensor) -> list:
    """The HOP's arguments ``full`` with its mods called at positions ``q_pos`` / ``k_pos``
    (the positions appended to both buffer tuples)."""
    full = list(full)
    score_at, mask_buffers_at = _SCORE_BUFFERS_ARG[hop_name], _MASK_BUFFERS_ARG[hop_name]
    n_score, n_mask = len(full[score_at]), len(full[mask_buffers_at])
    for pos, joint in _SCORE_GRAPHS[hop_name].items():
        wrapper = _joint_at_positions if joint else _score_at_positions
        full[pos] = wrapper(full[pos], n_score)
    mask_at = _BLOCK_MASK_ARG[hop_name]
    mask_mod = _mask_at_positions(full[mask_at][-1], n_mask)
    full[mask_at] = (*full[mask_at][:-1], mask_mod)
    full[score_at] = (*full[score_at], q_pos, k_pos)
    full[mask_buffers_at] = (*full[mask_buffers_at], q_pos, k_pos)
    return full


class LocalBlockMasks:
    """Block masks rebuilt for a rank's positions (``local_block_mask``), kept for the calls
    that follow: every layer's forward and backward call of a step reads the same mask at the
    same positions, and each rebuild evaluates ``mask_mod`` over all local query x key pairs.
    An entry serves a call with the same mask (``_mask_identity``), block sizes, shapes,
    device, positions key and the very same mask buffer tensors, compared by identity and
    version (a tensor written in place is a new key); the entry holds those tensors, so their
    ids cannot pass to others.
    The oldest entries go beyond ``capacity``; nothing is kept while tracing (the values
    there are graph values, not tensors to reuse in a later run)."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self.built = 0  # rebuilds done, for tests and reports
        self._entries: dict[tuple, tuple[tuple, tuple]] = {}  # key -> (buffers held, mask)

    def get(
        self,
        mask_identity: Any,
        block_mask: tuple,
        buffers: tuple,
        own: int,
        q: torch.Tensor,
        k: torch.Tensor,
        positions_key: Any,
    ) -> tuple:
        """``local_block_mask(block_mask, buffers, q, k)``, from an earlier call when one
        matches; ``buffers[:own]`` are the mask's own tensors, the rest its positions, which
        ``positions_key`` names."""
        if _tracing(q):
            return local_block_mask(block_mask, buffers, q, k)
        held = tuple(buffers[:own])
        key = (
            mask_identity,
            block_mask[-3],
            block_mask[-2],
            tuple(q.shape),
            tuple(k.shape),
            q.device,
            positions_key,
            tuple((id(t), getattr(t, "_version", None)) for t in held),
        )
        hit = self._entries.pop(key, None)
        if hit is None:
            self.built += 1
            hit = (held, local_block_mask(block_mask, buffers, q, k))
        self._entries[key] = hit  # most recently used last
        while len(self._entries) > self.capacity:
            del self._entries[next(iter(self._entries))]
        return (*hit[1][:-1], block_mask[-1])  # the call's own mask_mod, at its positions


def _mask_identity(mask_mod: Any) -> Any:
    """What makes two mask graphs the same mask: their code (the layers' graphs differ in
    name only) and the tensors it reads as attributes (the same code may read another
    layer's constants; the graph holds them, so their ids stay theirs)."""
    if not isinstance(mask_mod, fx.GraphModule):
        return mask_mod
    constants = mask_mod.graph.find_nodes(op="get_attr")
    return mask_mod.code, tuple(id(getattr(mask_mod, n.target)) for n in constants)


def _tracing(t: torch.Tensor) -> bool:
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return (
        detect_fake_mode((t,)) is not None
        or get_proxy_mode() is not None
        or torch.compiler.is_compiling()
    )


def local_block_mask(block_mask: tuple, buffers: tuple, q: torch.Tensor, k: torch.Tensor):
    """``block_mask`` (the HOP's tuple, its ``mask_mod`` taking ``buffers``) with its block
    tensors computed again for a call on ``q`` and ``k``: the blocks of the local queries
    and keys that the mask keeps, at the mask's block sizes."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask_mod = block_mask[-1]
    q_block, kv_block = block_mask[-3], block_mask[-2]
    rebuilt = create_block_mask(
        lambda b, h, q_idx, kv_idx: mask_mod(b, h, q_idx, kv_idx, *buffers),
        q.shape[0],
        q.shape[1],
        q.shape[2],
        k.shape[2],
        device=q.device,
        BLOCK_SIZE=(q_block, kv_block),
    )
    return (*rebuilt.as_tuple()[:-1], mask_mod)
