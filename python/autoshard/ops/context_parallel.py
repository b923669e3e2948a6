"""Context parallelism: scaled dot-product attention with the query sequence sharded.

The sequence row of cpp/src/rules/attention.cpp (the all-gather-K/V recipe) runs the CPU flash
kernel on each rank's block of queries against the whole key / value sequence: q, out and
logsumexp hold the rank's query positions, k and v every position. A non-causal call is the
same call on those blocks. A causal call is not: SDPA's ``is_causal`` aligns the mask top-left
(query i sees keys 0..i of the *local* call), while rank r's first query is at global position
``offset = r x local length``. So the local call gets ``is_causal=False`` and an explicit
additive mask (0 where key <= offset + i, -inf elsewhere; added to a mask the call already
had), for the forward and the backward alike, which keeps the kernel's own logsumexp and
gradients exact.

The offset comes from the plan's layout of q and the rank's mesh coordinate, known when the
program is lowered (each rank's program holds its own offset as a constant); while one
program is traced for every rank (``compile_on_one_rank``) the coordinate is a symbol and the
offset is computed from it. The reference interpreter and the numeric rule validator
(_testing/validate.py) call the same function, so all three run the same local call.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

# op -> (index of q among the tensor inputs, positional index of is_causal)
CAUSAL_SEQUENCE_OPS = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (0, 4),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (1, 7),
}
SEQ_DIM = 2  # q is [B, H, S, D]
CAUSAL_SEQUENCE_OPS_BY_OVERLOAD = (
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
)


def _sharded_mesh_dims(layout: Sequence[str] | None) -> list[int]:
    return [d for d, p in enumerate(layout or ()) if p == f"S({SEQ_DIM})"]


def query_offset(
    layout: Sequence[str], mesh_shape: Sequence[int], coordinate: Callable[[int], Any], length: int
):
    """The global position of this rank's first query: q (``length`` queries) in ``layout``
    (one placement string per mesh dim), split evenly mesh dim by mesh dim in order (as
    DTensor chunks nested shards; the C++ rule accepts even splits only). ``coordinate(d)``
    is the rank's index on mesh dim ``d`` (an int, or a symbol for one program for every
    rank)."""
    offset, block = 0, length
    for d in _sharded_mesh_dims(layout):
        block //= mesh_shape[d]
        offset = offset + coordinate(d) * block
    return offset


def needs_offset(op: str, args: Sequence[Any], input_layouts: Sequence[Any] | None) -> bool:
    """Whether ``op`` called with ``args`` in these input layouts (the plan's, one list of
    placement strings per tensor input) is a causal attention call whose queries are
    sharded on the sequence: its local call needs the rank's offset."""
    spec = CAUSAL_SEQUENCE_OPS.get(op)
    if spec is None or input_layouts is None:
        return False
    q_at, causal_at = spec
    causal = bool(args[causal_at]) if len(args) > causal_at else False
    return causal and bool(_sharded_mesh_dims(input_layouts[q_at]))


def causal_offset_call(op: str, args: Sequence[Any], kwargs: dict, offset) -> tuple[tuple, dict]:
    """``args`` / ``kwargs`` of a causal ``op`` call (local shards: q holds queries from
    global position ``offset`` on, k every key) as a non-causal call with the equivalent
    explicit mask."""
    q_at, _ = CAUSAL_SEQUENCE_OPS[op]
    q, k = args[q_at], args[q_at + 1]
    q_pos = torch.arange(q.shape[SEQ_DIM], device=q.device) + offset
    k_pos = torch.arange(k.shape[SEQ_DIM], device=q.device)
    return causal_positions_call(op, args, kwargs, q_pos, k_pos)


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
