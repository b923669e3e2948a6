"""Block-causal attention: the local kernels of a causal attention with sharded queries.

With context parallelism each rank holds some query positions and all-gathers every key /
value. The causal call over those is a set of (query, key) position pairs that is far from
the dense ``[local queries x all keys]`` block: one dense call with an explicit ``-inf`` mask
computes every pair (twice the causal work) and materialises the mask. Here the positions
are described by *chunks*, ``(global start, length)`` runs of consecutive positions,
concatenated in storage order (a contiguous split: one query chunk; the load-balanced
head-tail split: two, and the gathered keys in head-tail order). For each query chunk:

- the keys at positions before its first query are seen by every query: one CPU flash call
  without a mask (the pieces concatenated when they are not one run in storage);
- a key chunk overlapping the chunk's own positions is a causal call on a suffix of the
  query rows: query position ``a + i`` sees keys ``a .. a + i`` of a key run starting at
  ``a``, which is exactly the kernel's top-left ``is_causal`` (rows past the last key see
  every key), so no chunking needs a mask, aligned or not;
- keys after its last query are skipped.

The partial results are merged by their logsumexp. The backward calls the CPU flash backward
once per forward block with the *merged* out and logsumexp: the kernel recomputes the
probabilities as ``exp(score - logsumexp)`` and ``rowsum(grad_out * out)`` from what it is
given, so with the global normaliser each block's gradients are exactly its share of the
dense call's.

GQA: the CPU flash kernel takes k / v with fewer heads than q (``Hkv`` dividing ``H``, query
head ``h`` reading kv head ``h // (H / Hkv)``, its grad_k / grad_v with ``Hkv`` heads), and
these functions pass k / v through as given; ``autoshard.models.Llama`` repeats the kv heads
before ``F.scaled_dot_product_attention``, so its traced calls have ``Hkv == H``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

Chunk = tuple[int, int]  # (global position of the first element, length)
_SEQ = 2  # q, k, v, out, grads are [B, H, S, D]; logsumexp [B, H, S]
_forward_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_backward_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@dataclass(frozen=True)
class _Run:
    """A chunk placed in storage: rows ``[row, row + length)`` hold positions
    ``[pos, pos + length)``."""

    row: int
    pos: int
    length: int


@dataclass(frozen=True)
class Block:
    """One CPU flash call: query rows ``[q_start, q_stop)`` (storage indices) against the
    key rows ``k_slices`` (storage ``(start, stop)`` pairs, concatenated in this order),
    with the kernel's top-left ``is_causal`` or without a mask."""

    q_start: int
    q_stop: int
    k_slices: tuple[tuple[int, int], ...]
    causal: bool

    @property
    def n_queries(self) -> int:
        return self.q_stop - self.q_start

    @property
    def n_keys(self) -> int:
        return sum(stop - start for start, stop in self.k_slices)

    @property
    def pairs(self) -> int:
        """The (query, key) pairs this call attends (the causal kernel skips the rest)."""
        nq, nk = self.n_queries, self.n_keys
        if not self.causal:
            return nq * nk
        seen = min(nq, nk)  # query row i sees min(i + 1, nk) keys
        return seen * (seen + 1) // 2 + (nq - seen) * nk


def _runs(chunks: Sequence[Chunk], length: int | None, what: str) -> list[_Run]:
    """``chunks`` placed one after the other in storage, adjacent ones with consecutive
    positions merged into one run (one call instead of two)."""
    runs: list[_Run] = []
    row = 0
    for chunk in chunks:
        pos, size = (int(x) for x in chunk)
        if pos < 0 or size < 0:
            raise ValueError(f"{what}: chunk {tuple(chunk)} has a negative start or length")
        if size == 0:
            continue
        last = runs[-1] if runs else None
        if last is not None and last.pos + last.length == pos:
            runs[-1] = _Run(last.row, last.pos, last.length + size)
        else:
            runs.append(_Run(row, pos, size))
        row += size
    if length is not None and row != length:
        raise ValueError(
            f"{what}: the chunks {list(chunks)} hold {row} positions, the tensor has "
            f"{length} along dim {_SEQ}"
        )
    return runs


def _joined(slices: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Storage slices in storage order, touching ones joined (a view instead of a copy);
    the order of the keys in a call without a mask does not matter."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(slices):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return tuple(out)


def _query_run_blocks(q: _Run, keys: list[_Run]) -> list[Block]:
    q_end = q.pos + q.length
    before: list[tuple[int, int]] = []
    diagonal: list[Block] = []
    for k in keys:
        k_end = k.pos + k.length
        if k.pos < q.pos:  # the part before the first query: every query sees it
            before.append((k.row, k.row + min(k_end, q.pos) - k.pos))
        start, stop = max(k.pos, q.pos), min(k_end, q_end)
        if start < stop:  # overlaps the queries' own positions: causal from `start` on
            rows = (k.row + start - k.pos, k.row + stop - k.pos)
            diagonal.append(Block(q.row + start - q.pos, q.row + q.length, (rows,), True))
    if not before and not any(b.q_start == q.row for b in diagonal):
        raise ValueError(
            f"the query at position {q.pos} sees no key (every key position is after it): "
            "a causal attention needs the keys at or before every query"
        )
    blocks = [Block(q.row, q.row + q.length, _joined(before), False)] if before else []
    # the first block of a run covers all its rows (the forward copies it, then merges)
    return blocks + sorted(diagonal, key=lambda b: b.q_start)


def plan_blocks(
    q_chunks: Sequence[Chunk],
    k_chunks: Sequence[Chunk],
    q_len: int | None = None,
    k_len: int | None = None,
) -> list[Block]:
    """The CPU flash calls of a causal attention (key position <= query position) whose
    queries are the concatenation of ``q_chunks`` and keys of ``k_chunks``
    (``(global start, length)`` each, in storage order). ``q_len`` / ``k_len``, where given,
    are checked against the chunks' total lengths. The blocks of one run of queries share
    ``q_stop`` (the run's end) and the first of them covers the whole run."""
    keys = _runs(k_chunks, k_len, "k_chunks")
    blocks: list[Block] = []
    for q in _runs(q_chunks, q_len, "q_chunks"):
        blocks += _query_run_blocks(q, keys)
    return blocks


def block_pairs(q_chunks: Sequence[Chunk], k_chunks: Sequence[Chunk]) -> int:
    """The (query, key) pairs the block calls attend: the causal pairs of these chunks, the
    rank's attention work (forward FLOPs = 4 x batch x heads x head_dim x pairs)."""
    return sum(block.pairs for block in plan_blocks(q_chunks, k_chunks))


def rank_chunks(seq: int, n: int, rank: int, load_balanced: bool) -> list[Chunk]:
    """Rank ``rank``'s query chunks when ``seq`` positions are split over ``n`` ranks:
    contiguously (``seq / n`` from ``rank x seq / n``), or load-balanced (chunks ``rank``
    and ``2n - 1 - rank`` of ``2n``, the head-tail order of trace/load_balance.py)."""
    parts = 2 * n if load_balanced else n
    if seq % parts:
        raise ValueError(f"a sequence of {seq} does not split into {parts} equal chunks")
    size = seq // parts
    if not load_balanced:
        return [(rank * size, size)]
    return [(rank * size, size), ((2 * n - 1 - rank) * size, size)]


def gathered_chunks(seq: int, n: int, load_balanced: bool) -> list[Chunk]:
    """The chunks of the keys all-gathered over the ``n`` ranks (rank order): with
    ``load_balanced``, the storage order of a head-tail sequence (trace/load_balance.py)."""
    return [c for rank in range(n) for c in rank_chunks(seq, n, rank, load_balanced)]


def chunk_positions(chunks: Sequence[Chunk], dtype=torch.int64, device=None) -> torch.Tensor:
    """The global position of each stored element of a sequence stored as ``chunks``."""
    return torch.cat([torch.arange(p, p + n, dtype=dtype, device=device) for p, n in chunks])


def _rows(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return x.narrow(_SEQ, start, stop - start)


def _gather(x: torch.Tensor, slices: tuple[tuple[int, int], ...]) -> torch.Tensor:
    if len(slices) == 1:
        return _rows(x, *slices[0])
    return torch.cat([_rows(x, *s) for s in slices], dim=_SEQ)


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    # the kernel's logsumexp (and its internal accumulation) dtype
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be [batch, heads, seq, head_dim]; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[_SEQ] != v.shape[_SEQ]:
        raise ValueError(f"k has {k.shape[_SEQ]} positions and v {v.shape[_SEQ]}")


def _merge(acc, lse, block: Block, out_b, lse_b, first: bool) -> None:
    """Fold one block's (out, logsumexp) into the running ones of its query rows:
    out = sum_i exp(lse_i - lse) out_i with lse = logsumexp_i lse_i, one block at a time;
    the first block of a run is copied (rows seen by one block are the kernel's own)."""
    acc_rows = _rows(acc, block.q_start, block.q_stop)
    lse_rows = _rows(lse, block.q_start, block.q_stop)
    if first:
        acc_rows.copy_(out_b)
        lse_rows.copy_(lse_b)
        return
    new = torch.logaddexp(lse_rows, lse_b)
    keep = torch.exp(lse_rows - new).unsqueeze(-1)
    take = torch.exp(lse_b - new).unsqueeze(-1)
    acc_rows.copy_(acc_rows * keep + out_b.to(acc.dtype) * take)
    lse_rows.copy_(new)


def block_causal_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_chunks: Sequence[Chunk],
    k_chunks: Sequence[Chunk],
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal attention (key position <= query position) of ``q`` [B, H, Lq, D] over
    ``k``, ``v`` [B, Hkv, Lk, D], positions given by ``q_chunks`` / ``k_chunks``; returns
    ``(out, logsumexp)`` as ``_scaled_dot_product_flash_attention_for_cpu`` lays them out
    (out like q, logsumexp [B, H, Lq] stored [B, Lq, H] in float32, float64 for float64)."""
    if dropout_p != 0.0:
        raise ValueError(
            f"block_causal_forward: dropout_p={dropout_p}; only 0 is supported (the blocks' "
            "dropout masks would not be the dense call's, nor its backward's)"
        )
    _check(q, k, v)
    blocks = plan_blocks(q_chunks, k_chunks, q.shape[_SEQ], k.shape[_SEQ])
    b, h, lq, _ = q.shape
    acc_dtype = _accumulate_dtype(q.dtype)
    out = torch.empty_like(q)
    acc = out if out.dtype == acc_dtype else torch.empty_like(q, dtype=acc_dtype)
    lse = torch.empty(b, lq, h, dtype=acc_dtype, device=q.device).transpose(1, 2)
    runs_started: set[int] = set()
    for block in blocks:
        out_b, lse_b = _forward_kernel(
            _rows(q, block.q_start, block.q_stop),
            _gather(k, block.k_slices),
            _gather(v, block.k_slices),
            0.0,
            block.causal,
            scale=scale,
        )
        _merge(acc, lse, block, out_b, lse_b, block.q_stop not in runs_started)
        runs_started.add(block.q_stop)
    if acc is not out:
        out.copy_(acc)
    return out, lse


def _grad_like(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # the CPU flash backward's gradient layout: [B, H, S, D] stored [B, S, H, D]
    return torch.zeros(
        x.shape[0], x.shape[2], x.shape[1], x.shape[3], dtype=dtype, device=x.device
    ).transpose(1, 2)


def _scatter_add(acc: torch.Tensor, grad: torch.Tensor, slices) -> None:
    """Add a block's grad_k / grad_v (its keys concatenated as ``slices``) into the rows
    the keys came from."""
    at = 0
    for start, stop in slices:
        _rows(acc, start, stop).add_(grad.narrow(_SEQ, at, stop - start))
        at += stop - start


def block_causal_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    q_chunks: Sequence[Chunk],
    k_chunks: Sequence[Chunk],
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``block_causal_forward`` (``out``, ``logsumexp`` its outputs):
    ``(grad_q, grad_k, grad_v)`` laid out as
    ``_scaled_dot_product_flash_attention_for_cpu_backward``'s, grad_k / grad_v the
    contributions of these queries only (zero at keys none of them sees)."""
    _check(q, k, v)
    blocks = plan_blocks(q_chunks, k_chunks, q.shape[_SEQ], k.shape[_SEQ])
    acc_dtype = _accumulate_dtype(q.dtype)
    grads = [_grad_like(x, acc_dtype) for x in (q, k, v)]
    for block in blocks:
        rows = (block.q_start, block.q_stop)
        g_q, g_k, g_v = _backward_kernel(
            _rows(grad_out, *rows),
            _rows(q, *rows),
            _gather(k, block.k_slices),
            _gather(v, block.k_slices),
            _rows(out, *rows),
            _rows(logsumexp, *rows),
            0.0,
            block.causal,
            scale=scale,
        )
        _rows(grads[0], *rows).add_(g_q)
        _scatter_add(grads[1], g_k, block.k_slices)
        _scatter_add(grads[2], g_v, block.k_slices)
    # accumulated in float32 for a low-precision dtype, as the kernel accumulates
    grad_q, grad_k, grad_v = (
        g if g.dtype == x.dtype else _grad_like(x, x.dtype).copy_(g)
        for g, x in zip(grads, (q, k, v))
    )
    return grad_q, grad_k, grad_v
