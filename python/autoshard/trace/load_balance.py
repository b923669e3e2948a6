"""The load-balanced (head + tail) order of the sequence for context parallelism.

With causal attention and the sequence split evenly over ``n`` ranks, rank r's queries see
``(2r+1)/n^2`` of the causal (query, key) pairs: the last rank does ``(2n-1)/n`` times the
even share (1.75x at n = 4). Cut the sequence into ``2n`` chunks and give rank r chunk r
(the head) and chunk ``2n-1-r`` (the tail): every rank then holds the same causal work.

autoshard does this in the trace, so that the traced graph computes the same function as the
model and every plan of it is exact by construction:

- the wrapper :class:`LoadBalancedStep` permutes every sequence-carrying input (a tensor
  whose dim 1 is the sequence length: tokens, labels, position ids) into head-tail order
  before the model runs, and puts outputs that keep the sequence back in natural order; the
  even ``Shard(1)`` split of the permuted tensors is then the head-tail split;
- the trace's decompositions (:meth:`LoadBalance.decompositions`) make the three things
  that read positions use the permuted ones: ``arange(seq)`` (the positions that rotary or
  learned position tables are built from) returns the positions in head-tail order; a
  FlexAttention call means its mods called at the head-tail positions (its BlockMask input,
  and the tables its mask_mod reads, stay in natural order); a causal
  CPU flash-attention call (forward and backward) stays causal and *means* ``key position <=
  query position`` over those positions: the runtime's local call runs it by the positions
  each rank holds (ops/context_parallel.local_call_at_positions), so the graph is exact when run
  by autoshard's interpreter or program (not when run as plain ATen); ``triu`` / ``tril`` over a ``[seq, seq]`` tensor (a hand-built causal mask) compares
  positions instead of storage indices.

Causal kernels with no rewrite (CUDA flash / efficient / cuDNN attention) raise, since the
permuted sequence would make their top-left causal mask silently wrong.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch import nn

from autoshard.ops import attention_blocks, context_parallel

log = logging.getLogger(__name__)
aten = torch.ops.aten
SEQ_DIM = 1  # the sequence dim of the model's inputs ([batch, seq, ...])

# causal kernels the trace cannot rewrite: op -> positional index of is_causal
_UNSUPPORTED_CAUSAL = {
    aten._scaled_dot_product_flash_attention.default: 4,
    aten._scaled_dot_product_efficient_attention.default: 6,
    aten._scaled_dot_product_cudnn_attention.default: 6,
}


class LoadBalanceError(ValueError):
    """The load-balanced split cannot be applied to this sequence or model."""


def head_tail_positions(seq: int, n: int, dtype=torch.int64, device=None) -> torch.Tensor:
    """The global position of each storage index of a sequence of ``seq`` in head-tail order
    for ``n`` ranks (the permutation applied to the inputs; the order itself is
    ops/attention_blocks.gathered_chunks, which the runtime's local calls read too). Built
    from per-chunk aranges, none of them arange(0, seq), so the decomposition of
    arange(seq) below does not apply to it."""
    chunks = attention_blocks.gathered_chunks(seq, n, load_balanced=True)
    return attention_blocks.chunk_positions(chunks, dtype=dtype, device=device)


def natural_order_index(seq: int, n: int, device=None) -> torch.Tensor:
    """The storage index of each global position (the inverse permutation): index_select
    by it puts a head-tail tensor back in natural order."""
    chunks = attention_blocks.gathered_chunks(seq, n, load_balanced=True)
    stored_at = itertools.accumulate((length for _, length in chunks), initial=0)
    by_position = sorted(zip(chunks, stored_at))  # ((position, length), storage start)
    return attention_blocks.chunk_positions(
        [(start, length) for (_, length), start in by_position], device=device
    )


def document_head_tail_order(document_lengths, n: int, device=None) -> torch.Tensor:
    """A storage order for packed documents on ``n`` context-parallel ranks: the position
    each storage index holds, such that an even split of the reordered sequence gives rank r
    the head chunk r and the tail chunk ``2n - 1 - r`` of every document (so each rank does
    the same causal work within every document, which the one head-tail order of the whole
    sequence does not do for a document mask).

    The order depends on the batch's documents, so the trainer applies it, as with torch's
    per-document load balancer: index the sequence inputs by it (tokens, labels, the document
    table), pass it as the model's positions, build the BlockMask over storage indices
    (its mask_mod reading the reordered tables), and plan with ``cp_load_balance=False`` (the
    contiguous split of the reordered sequence). Every document length must divide by
    ``2n``; pad documents to it."""
    lengths = [int(x) for x in document_lengths]
    odd = [x for x in lengths if x % (2 * n)]
    if odd:
        raise LoadBalanceError(
            f"document_head_tail_order: document lengths {odd} do not divide into 2 x cp = "
            f"{2 * n} chunks; pad each document to a multiple of {2 * n}"
        )
    starts = list(itertools.accumulate(lengths, initial=0))
    chunks = [
        (start + pos, size)  # the document's own head-tail chunks for this rank
        for rank in range(n)
        for start, length in zip(starts, lengths)
        for pos, size in attention_blocks.rank_chunks(length, n, rank, load_balanced=True)
    ]
    return attention_blocks.chunk_positions(chunks, device=device)


def causal_pairs_per_rank(positions: torch.Tensor, n: int) -> list[int]:
    """The allowed (query, key) pairs of each rank's causal mask, with the sequence stored
    in ``positions`` order and split evenly over ``n`` ranks (keys: the whole sequence)."""
    allowed = positions.unsqueeze(0) <= positions.unsqueeze(1)  # [query, key]
    return [int(rows.sum()) for rows in allowed.chunk(n, dim=0)]


@dataclass(frozen=True)
class LoadBalance:
    """Head-tail order for ``n`` context-parallel ranks. ``strict``: a sequence that does not
    divide by 2n raises (the user asked for the split); otherwise it falls back to the
    natural order (contiguous split, uneven causal work) with a warning."""

    n: int
    strict: bool = False

    def sequence_length(self, args, kwargs) -> int | None:
        """The sequence length the order applies to (dim 1 of the first input of 2 or more
        dims), or None where it does not apply (no such input, or the fallback)."""
        flat = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        seq = next((int(x.shape[SEQ_DIM]) for x in flat if x.dim() > SEQ_DIM), None)
        if seq is None or self.n <= 1:
            return None
        if seq % (2 * self.n):
            msg = (
                f"cp_load_balance: sequence length {seq} (dim {SEQ_DIM} of the inputs) does "
                f"not divide into 2 x cp = {2 * self.n} chunks"
            )
            if self.strict:
                raise LoadBalanceError(
                    f"{msg}; pad the sequence to a multiple of {2 * self.n}, or pass "
                    "cp_load_balance=False for the contiguous split (uneven causal work)"
                )
            log.warning("autoshard: %s; using the contiguous split (uneven causal work)", msg)
            return None
        return seq

    def wrap(self, root: nn.Module, seq: int) -> nn.Module:
        return LoadBalancedStep(root, seq, self.n)

    def decompositions(self, seq: int) -> dict:
        """The trace's decompositions that make position-reading ops use head-tail order."""
        table = {op: _arange_in_order(seq, self.n) for op in _ARANGES}
        for op in context_parallel.CAUSAL_SEQUENCE_OPS_BY_OVERLOAD:
            table[op] = _causal_in_order(op, seq, self.n)
        for op, causal_at in _UNSUPPORTED_CAUSAL.items():
            table[op] = _refuse_causal(op, causal_at)
        table[aten.triu.default] = _band_in_order(seq, self.n, upper=True)
        table[aten.tril.default] = _band_in_order(seq, self.n, upper=False)
        return table


class LoadBalancedStep(nn.Module):
    """Wraps the (fake) model for tracing: sequence inputs permuted into head-tail order,
    sequence outputs put back in natural order. The parameters are the wrapped model's, so
    names map back by identity (as mixed_precision.CastingStep's)."""

    def __init__(self, inner: nn.Module, seq: int, n: int):
        super().__init__()
        self.inner = inner
        self.seq, self.n = seq, n

    def _carries_sequence(self, x) -> bool:
        if not (isinstance(x, torch.Tensor) and x.dim() > SEQ_DIM and x.shape[SEQ_DIM] == self.seq):
            return False
        if self.seq in tuple(x.shape[SEQ_DIM + 1 :]):
            # e.g. a per-sample [batch, seq, seq] mask: its other dim would need the order
            # too, or it is a feature dim of the same size; either way ambiguous
            raise LoadBalanceError(
                f"cp_load_balance: a model input or output of shape {list(x.shape)} has the "
                f"sequence length {self.seq} in a dim other than {SEQ_DIM}; only dim "
                f"{SEQ_DIM} is put in head-tail order. Pass cp_load_balance=False"
            )
        return True

    def _reorder(self, tree, index_of):
        from torch.nn.attention.flex_attention import BlockMask

        def one(x):
            if not self._carries_sequence(x):
                return x
            return torch.index_select(x, SEQ_DIM, index_of(x.device))

        # a BlockMask stays in natural order, with the tables its mask_mod reads (a
        # document table [batch, seq]): FlexAttention calls its mods at the head-tail
        # positions (ops/context_parallel.local_call_at_positions), not storage indices
        block_mask = lambda x: isinstance(x, BlockMask)  # noqa: E731
        return pytree.tree_map(lambda x: x if block_mask(x) else one(x), tree, is_leaf=block_mask)

    def forward(self, *args, **kwargs):
        args, kwargs = self._reorder(
            (args, kwargs), lambda d: head_tail_positions(self.seq, self.n, device=d)
        )
        out = self.inner(*args, **kwargs)
        return self._reorder(out, lambda d: natural_order_index(self.seq, self.n, device=d))


_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)


def _arange_in_order(seq: int, n: int):
    """arange(0, seq): the positions in head-tail order (any other arange: unchanged)."""

    def decomposed(*args, dtype=None, layout=None, device=None, pin_memory=None):
        start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        if not (start == 0 and step == 1 and end == seq):
            return NotImplemented
        if dtype is None:
            dtype = torch.int64 if isinstance(end, int) else torch.get_default_dtype()
        return head_tail_positions(seq, n, dtype=dtype, device=device)

    return decomposed


def _causal_in_order(op, seq: int, n: int):
    """A causal attention call over the whole (permuted) sequence stays a causal call: in a
    step traced in head-tail order it means causal over the head-tail *positions*, which is
    how the runtime runs it (ops/context_parallel.local_call_at_positions: block kernels over each
    rank's position chunks, no [seq, seq] mask). Calls over another length are refused."""
    name = str(op)
    q_at, causal_at = context_parallel.CAUSAL_SEQUENCE_OPS[name]

    def decomposed(*args, **kwargs):
        causal = len(args) > causal_at and bool(args[causal_at])
        q, k = args[q_at], args[q_at + 1]
        if causal and (q.shape[-2] != seq or k.shape[-2] != seq):
            raise LoadBalanceError(
                f"cp_load_balance: a causal attention call with {q.shape[-2]} queries and "
                f"{k.shape[-2]} keys, not the inputs' sequence of {seq}; its positions are "
                "unknown. Pass cp_load_balance=False"
            )
        return NotImplemented

    return decomposed


def _refuse_causal(op, causal_at: int):
    def decomposed(*args, **kwargs):
        if len(args) > causal_at and bool(args[causal_at]):
            raise LoadBalanceError(
                f"cp_load_balance: causal {op} has no load-balanced form (only the CPU "
                "flash-attention kernel does); pass cp_load_balance=False"
            )
        return NotImplemented

    return decomposed


def _band_in_order(seq: int, n: int, upper: bool):
    """triu / tril of a tensor whose last two dims are the (permuted) sequence: keep the
    entries whose *positions* (not storage indices) are in the band."""

    def decomposed(x, diagonal=0):
        if x.dim() < 2 or tuple(x.shape[-2:]) != (seq, seq):
            return NotImplemented
        pos = head_tail_positions(seq, n, device=x.device)
        offset = pos.unsqueeze(0) - pos.unsqueeze(1)  # [row, col]: col position - row position
        keep = offset >= diagonal if upper else offset <= diagonal
        return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))

    return decomposed


CP_DIM = "cp"  # the mesh dim name that splits the sequence


def load_balance_for(option: bool | None, shape, dim_names) -> LoadBalance | None:
    """The LoadBalance of AutoParallel's ``cp_load_balance`` option on a mesh of ``shape``
    with ``dim_names``: None (default) is on where the mesh has a "cp" dim of size > 1 (with
    the fallback to the contiguous split), True is on and strict, False off."""
    if option not in (None, True, False):
        raise ValueError(f"cp_load_balance must be True, False or None, got {option!r}")
    names = tuple(dim_names or ())
    if option is False:
        return None
    if CP_DIM not in names:
        if option:
            raise LoadBalanceError(
                f"cp_load_balance=True needs a mesh dim named {CP_DIM!r} (the sequence's "
                f"dim), got dims {list(names)}; name the context-parallel dim {CP_DIM!r}"
            )
        return None
    n = int(tuple(shape)[names.index(CP_DIM)])
    return LoadBalance(n, strict=bool(option)) if n > 1 else None
