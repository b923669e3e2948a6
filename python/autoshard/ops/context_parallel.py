"""Context parallelism: scaled dot-product attention with the query sequence sharded.

The sequence row of cpp/src/rules/attention.cpp (the all-gather-K/V recipe) runs the CPU flash
kernel on each rank's block of queries against the whole key / value sequence: q, out and
logsumexp hold the rank's query positions, k and v every position. A non-causal call is the
same call on those blocks. A causal call is not: SDPA's ``is_causal`` aligns the mask top-left
(query i sees keys 0..i of the *local* call), while rank r's queries sit at other global
positions. In a step traced in the load-balanced head-tail order (trace/load_balance.py) a
causal call means causal over the head-tail *positions* of the stored sequence, whether its
queries are sharded or not.

``local_call_at_positions`` runs such a call from the positions the rank's shards hold: the
storage offset of q's shard (``query_offset``: the plan's layout of q and the rank's mesh
coordinate) and the storage order give *chunks* of consecutive positions, and block-causal kernels
(ops/attention_blocks.py) attend each query chunk to the keys before it and to its diagonal,
skipping the pairs a causal mask hides and allocating no mask. A call the kernels do not
take (a mask of its own, dropout) or a symbolic coordinate (one program traced for every
rank, ``compile_on_one_rank``) gets the explicit additive mask instead (0 where key position
<= query position, -inf elsewhere, added to the call's own mask; ``causal_positions_call``):
the same function.

FlexAttention calls (the sequence row of cpp/src/rules/flex_attention.cpp) take the same path
for another reason: their ``score_mod`` / ``mask_mod`` read the query and key indices, which
on a shard (or in head-tail order) are not the positions. ``local_call_at_positions`` calls
them at the positions the rank's shards hold (flex_attention.FlexAttentionCall
.call_at_positions), with a contiguous split as with the head-tail order, and whatever the
mask (causal, documents).

The reference interpreter (and so the program lowered from it) and the numeric rule validator
(_testing/validate.py) call the same function.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from autoshard.ops import attention_blocks

# op -> (index of q among the tensor inputs, positional index of is_causal)
CAUSAL_SEQUENCE_OPS = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (0, 4),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (1, 7),
}
# FlexAttention's higher-order ops (flex_attention.FlexAttentionCall): q is tensor input 0
FLEX_ATTENTION_OPS = ("higher_order.flex_attention", "higher_order.flex_attention_backward")
SEQ_DIM = 2  # q is [B, H, S, D]
CAUSAL_SEQUENCE_OPS_BY_OVERLOAD = (
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
)


def q_input(op: str) -> int:
    """The index of q among ``op``'s tensor inputs (k is the next one)."""
    return 0 if op in FLEX_ATTENTION_OPS else CAUSAL_SEQUENCE_OPS[op][0]


def _sharded_mesh_dims(layout: Sequence[str] | None, dim: int = SEQ_DIM) -> list[int]:
    return [d for d, p in enumerate(layout or ()) if p == f"S({dim})"]


def query_offset(
    layout: Sequence[str],
    mesh_shape: Sequence[int],
    coordinate: Callable[[int], Any],
    length: int,
    dim: int = SEQ_DIM,
):
    """The global position of this rank's first query: q (``length`` queries along ``dim``)
    in ``layout`` (one placement string per mesh dim), split evenly mesh dim by mesh dim in
    order (as DTensor chunks nested shards; the C++ rules accept even splits only).
    ``coordinate(d)`` is the rank's index on mesh dim ``d`` (an int, or a symbol for one
    program for every rank)."""
    offset, block = 0, length
    for d in _sharded_mesh_dims(layout, dim):
        block //= mesh_shape[d]
        offset = offset + coordinate(d) * block
    return offset


def shard_starts(
    op: str, input_layouts: Sequence[Any], mesh_shape: Sequence[int], coordinate, seq: int
) -> tuple[Any, Any]:
    """Where this rank's shards of q and k start in the stored sequence of ``seq``: their
    layouts (the plan's, one list of placement strings per tensor input) split evenly mesh
    dim by mesh dim, ``coordinate(d)`` the rank's index on mesh dim ``d``."""
    q_at = q_input(op)

    def start(k: int):
        layout = input_layouts[k] if k < len(input_layouts) else None
        return query_offset(layout, mesh_shape, coordinate, seq)

    return start(q_at), start(q_at + 1)


def is_causal_call(op: str, args: Sequence[Any]) -> bool:
    spec = CAUSAL_SEQUENCE_OPS.get(op)
    return spec is not None and len(args) > spec[1] and bool(args[spec[1]])


def needs_offset(op: str, args: Sequence[Any], input_layouts: Sequence[Any] | None) -> bool:
    """Whether ``op`` called with ``args`` in these input layouts (the plan's, one list of
    placement strings per tensor input) is a causal attention call whose queries are
    sharded on the sequence: its local call needs the rank's offset."""
    if not is_causal_call(op, args) or input_layouts is None:
        return False
    return bool(_sharded_mesh_dims(input_layouts[CAUSAL_SEQUENCE_OPS[op][0]]))


def needs_local_call(
    op: str, args: Sequence[Any], input_layouts: Sequence[Any] | None, balanced: int | None
) -> bool:
    """Whether the local run of ``op`` goes through :func:`local_call_at_positions`: a causal
    call (or any FlexAttention call) whose queries are sequence-sharded, or any causal (or
    FlexAttention) call of a step traced in head-tail order for ``balanced`` ranks (its
    storage order is not its positions)."""
    if op in FLEX_ATTENTION_OPS:
        return bool(balanced) or bool(
            input_layouts is not None and _sharded_mesh_dims(input_layouts[0])
        )
    if balanced:
        return is_causal_call(op, args)
    return needs_offset(op, args, input_layouts)


def storage_chunks(seq: int, balanced: int | None) -> list[attention_blocks.Chunk]:
    """The positions of a stored sequence of ``seq``, as chunks in storage order: natural
    order, or the head-tail order of trace/load_balance.py for ``balanced`` ranks."""
    if not balanced:
        return [(0, seq)]
    return attention_blocks.gathered_chunks(seq, balanced, load_balanced=True)


def chunks_of_range(
    chunks: Sequence[attention_blocks.Chunk], start: int, length: int
) -> list[attention_blocks.Chunk]:
    """The positions of storage elements ``start .. start + length`` of a sequence stored as
    ``chunks``."""
    out, at = [], 0
    for pos, n in chunks:
        lo, hi = max(start, at), min(start + length, at + n)
        if lo < hi:
            out.append((pos + lo - at, hi - lo))
        at += n
    return out


def local_call_at_positions(
    op: str,
    args: Sequence[Any],
    kwargs: dict,
    seq: int,
    balanced: int | None,
    q_start,
    k_start,
    call: Callable,
    block_masks=None,
) -> Any:
    """Run ``op`` on local shards at their positions: q holds storage elements ``q_start ..``
    and k ``k_start ..`` of a sequence of ``seq`` stored in natural order, or head-tail order
    for ``balanced`` ranks. A FlexAttention call (``call``, its FlexAttentionCall) calls its
    mods at those positions, its block mask rebuilt for them off the CPU and kept in
    ``block_masks`` (a flex_attention.LocalBlockMasks, or None). A causal call: block-causal
    kernels when the starts are ints and the call has no mask or dropout of its own;
    otherwise ``call`` (the op's local implementation) with the explicit positions mask, the
    same function."""
    q_at = q_input(op)
    q, k = args[q_at], args[q_at + 1]
    stored = storage_chunks(seq, balanced)
    concrete = isinstance(q_start, int) and isinstance(k_start, int)
    if op not in FLEX_ATTENTION_OPS:
        causal_at = CAUSAL_SEQUENCE_OPS[op][1]
        dropout_p = args[causal_at - 1] if len(args) >= causal_at else 0.0
        if concrete and kwargs.get("attn_mask") is None and not dropout_p:
            q_chunks = chunks_of_range(stored, q_start, q.shape[SEQ_DIM])
            k_chunks = chunks_of_range(stored, k_start, k.shape[SEQ_DIM])
            return _block_call(op, args, kwargs, q_chunks, k_chunks)
    q_pos = _positions(stored, q_start, q.shape[SEQ_DIM], q.device)
    k_pos = _positions(stored, k_start, k.shape[SEQ_DIM], q.device)
    if op in FLEX_ATTENTION_OPS:
        key = (tuple(stored), q_start, k_start) if concrete else None
        return call.call_at_positions(
            tuple(args), q_pos, k_pos, block_masks=block_masks, positions_key=key
        )
    args, kwargs = causal_positions_call(op, args, kwargs, q_pos, k_pos)
    return call(*args, **kwargs)


def _positions(stored: Sequence[attention_blocks.Chunk], start, length: int, device):
    """The positions of storage elements ``start .. start + length`` of a sequence stored as
    ``stored``, as a tensor; ``start`` an int, or a symbol (one program for every rank)."""
    if isinstance(start, int):
        return attention_blocks.chunk_positions(
            chunks_of_range(stored, start, length), device=device
        )
    return attention_blocks.chunk_positions(stored, device=device).narrow(0, start, length)


def _block_call(op: str, args: Sequence[Any], kwargs: dict, q_chunks, k_chunks) -> Any:
    scale = kwargs.get("scale")
    if op.endswith("_backward.default"):
        grad_out, q, k, v, out, logsumexp = args[:6]
        return attention_blocks.block_causal_backward(
            grad_out, q, k, v, out, logsumexp, q_chunks, k_chunks, scale=scale
        )
    q, k, v = args[:3]
    return attention_blocks.block_causal_forward(q, k, v, q_chunks, k_chunks, scale=scale)


def causal_positions_call(
    op: str, args: Sequence[Any], kwargs: dict, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> tuple[tuple, dict]:
    """``args`` / ``kwargs`` of a causal ``op`` call whose queries sit at global positions
    ``q_pos`` and keys at ``k_pos`` (any order: a block of a contiguous split, or the
    load-balanced head-tail order of trace/load_balance.py) as a non-causal call with the
    explicit mask ``key position <= query position`` (added to a mask the call had)."""
    q_at, causal_at = CAUSAL_SEQUENCE_OPS[op]
    q = args[q_at]
    hidden = k_pos.unsqueeze(0) > q_pos.unsqueeze(1)  # [n_q, n_k]: keys after the query
    mask = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill(
        hidden, float("-inf")
    )
    kwargs = dict(kwargs)
    given = kwargs.get("attn_mask")
    if given is not None:
        if given.dtype == torch.bool:
            given = torch.zeros_like(given, dtype=q.dtype).masked_fill(~given, float("-inf"))
        mask = given + mask
    kwargs["attn_mask"] = mask
    args = list(args)
    args[causal_at] = False
    return tuple(args), kwargs
