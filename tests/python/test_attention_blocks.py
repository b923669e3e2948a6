"""ops/attention_blocks.py: the block-causal local kernels of context parallelism against
the dense causal attention over the whole sequence, forward and backward, for contiguous,
head-tail and arbitrary (unaligned) chunkings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoshard.ops.attention_blocks import (
    block_causal_backward,
    block_causal_forward,
    block_pairs,
    gathered_chunks,
    plan_blocks,
    rank_chunks,
)

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5}


def positions(chunks) -> torch.Tensor:
    return torch.cat([torch.arange(start, start + size) for start, size in chunks])


def head_tail_cases(seq: int):
    for n in (2, 3, 4):
        keys = gathered_chunks(seq, n, load_balanced=True)
        for rank in range(n):
            yield pytest.param(
                seq, rank_chunks(seq, n, rank, True), keys, id=f"head-tail-n{n}-r{rank}"
            )


CASES = [
    pytest.param(24, [(0, 6)], [(0, 24)], id="one-chunk-offset-0"),
    pytest.param(24, [(12, 6)], [(0, 24)], id="one-chunk-offset-12"),
    pytest.param(24, rank_chunks(24, 4, 3, False), [(0, 24)], id="contiguous-n4-r3"),
    *head_tail_cases(48),
    # query chunks not aligned with any key chunk, keys in a shuffled storage order
    pytest.param(30, [(5, 7), (20, 3)], [(0, 3), (13, 10), (3, 10), (23, 7)], id="unaligned"),
    # one query chunk whose diagonal spans two key chunks, one straddling its first query
    pytest.param(24, [(10, 12)], [(16, 8), (0, 8), (8, 8)], id="diagonal-over-two-chunks"),
    # query chunks adjacent in positions and storage (one run), a query chunk before them
    pytest.param(20, [(4, 4), (8, 4), (1, 2)], [(0, 20)], id="adjacent-query-chunks"),
]


def dense_reference(seq, q_chunks, k_chunks, dtype, kv_heads=3, heads=3):
    """The dense causal attention on the whole sequence, its outputs at the rank's query
    rows, and its gradients for a grad_out at those rows only, in the rank's storage order."""
    torch.manual_seed(0)
    shape = (2, heads, seq, 8)
    kv_shape = (2, kv_heads, seq, 8)
    q_full = torch.randn(shape, dtype=dtype, requires_grad=True)
    k_full = torch.randn(kv_shape, dtype=dtype, requires_grad=True)
    v_full = torch.randn(kv_shape, dtype=dtype, requires_grad=True)
    out_full = F.scaled_dot_product_attention(
        q_full, k_full, v_full, is_causal=True, enable_gqa=kv_heads != heads
    )
    q_pos, k_pos = positions(q_chunks), positions(k_chunks)
    grad_out = torch.randn(shape[:2] + (len(q_pos), 8), dtype=dtype)
    placed = torch.zeros_like(out_full).index_copy(2, q_pos, grad_out)
    out_full.backward(placed)
    with torch.no_grad():
        _, lse_full = FLASH(q_full, k_full, v_full, 0.0, True)
    local = (q_full[:, :, q_pos], k_full[:, :, k_pos], v_full[:, :, k_pos])
    expected = {
        "out": out_full[:, :, q_pos],
        "lse": lse_full[:, :, q_pos],
        "grads": (q_full.grad[:, :, q_pos], k_full.grad[:, :, k_pos], v_full.grad[:, :, k_pos]),
    }
    return [x.detach() for x in local], grad_out, expected


def assert_close(actual, expected, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seq, q_chunks, k_chunks", CASES)
def test_matches_dense_causal_attention(seq, q_chunks, k_chunks, dtype):
    (q, k, v), grad_out, expected = dense_reference(seq, q_chunks, k_chunks, dtype)
    out, lse = block_causal_forward(q, k, v, q_chunks, k_chunks)
    assert_close(out, expected["out"], dtype)
    assert_close(lse, expected["lse"], dtype)
    grads = block_causal_backward(grad_out, q, k, v, out, lse, q_chunks, k_chunks)
    for grad, want in zip(grads, expected["grads"]):
        assert_close(grad, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_query_attention(dtype):
    """k / v with fewer heads than q go to the kernel as they are (it shares each kv head
    among H / Hkv query heads); grad_k / grad_v come back with Hkv heads."""
    q_chunks, k_chunks = rank_chunks(32, 2, 1, True), gathered_chunks(32, 2, True)
    (q, k, v), grad_out, expected = dense_reference(32, q_chunks, k_chunks, dtype, 2, 4)
    out, lse = block_causal_forward(q, k, v, q_chunks, k_chunks)
    assert_close(out, expected["out"], dtype)
    grads = block_causal_backward(grad_out, q, k, v, out, lse, q_chunks, k_chunks)
    assert grads[1].shape == k.shape
    for grad, want in zip(grads, expected["grads"]):
        assert_close(grad, want, dtype)


def masked_kernel_calls(q, k, v, grad_out, q_chunks, k_chunks, scale):
    """The dense call being replaced: non-causal with the explicit -inf mask over
    positions (ops/context_parallel.causal_positions_call)."""
    hidden = positions(k_chunks).unsqueeze(0) > positions(q_chunks).unsqueeze(1)
    mask = torch.zeros(hidden.shape, dtype=q.dtype).masked_fill(hidden, float("-inf"))
    out, lse = FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    grads = FLASH_BACKWARD(grad_out, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale)
    return out, lse, grads


@pytest.mark.parametrize(
    "dtype, seq_major", [(torch.float64, False), (torch.float32, True), (torch.bfloat16, False)]
)
def test_same_outputs_and_layouts_as_the_masked_kernel(dtype, seq_major):
    """Against the dense masked call: the same values, dtypes and strides (out like q,
    logsumexp and the gradients stored sequence-major), also for q / k / v stored
    [B, S, H, D] (as the model's transpose(1, 2) makes them), a scale, and keys that are a
    subset of the positions."""
    torch.manual_seed(1)
    q_chunks, k_chunks = [(9, 5), (30, 6)], [(20, 16), (0, 12)]
    lq, lk = 11, 28

    def make(length):
        if seq_major:
            return torch.randn(2, length, 3, 8).to(dtype).transpose(1, 2)
        return torch.randn(2, 3, length, 8).to(dtype)

    q, k, v, grad_out = make(lq), make(lk), make(lk), make(lq)
    out, lse = block_causal_forward(q, k, v, q_chunks, k_chunks, scale=0.25)
    grads = block_causal_backward(grad_out, q, k, v, out, lse, q_chunks, k_chunks, scale=0.25)
    want_out, want_lse, want_grads = masked_kernel_calls(
        q, k, v, grad_out, q_chunks, k_chunks, 0.25
    )
    tol = 2e-2 if dtype == torch.bfloat16 else TOLERANCE[dtype]
    for got, want in zip((out, lse, *grads), (want_out, want_lse, *want_grads)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def causal_pairs(q_chunks, k_chunks) -> int:
    return int((positions(k_chunks).unsqueeze(0) <= positions(q_chunks).unsqueeze(1)).sum())


@pytest.mark.parametrize("seq, q_chunks, k_chunks", CASES)
def test_pairs_are_the_causal_pairs(seq, q_chunks, k_chunks):
    assert block_pairs(q_chunks, k_chunks) == causal_pairs(q_chunks, k_chunks)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_head_tail_ranks_do_equal_work(n):
    seq = 4096 if n != 3 else 4098
    keys = gathered_chunks(seq, n, load_balanced=True)
    pairs = [block_pairs(rank_chunks(seq, n, r, True), keys) for r in range(n)]
    assert sum(pairs) == seq * (seq + 1) // 2
    assert max(pairs) <= 1.1 * min(pairs), pairs
    contiguous = [block_pairs(rank_chunks(seq, n, r, False), [(0, seq)]) for r in range(n)]
    assert max(contiguous) > 1.1 * min(contiguous)  # what the head-tail split fixes


def test_head_tail_calls_need_no_mask():
    """Rank r of n under head-tail: its head chunk is one causal call (after one call over
    the r chunks before it where r > 0), its tail one causal call after one call over the
    2n - 1 - r chunks before it; the last rank's head and tail are consecutive positions,
    one run of two chunks (one call over the chunks before, one causal call)."""
    seq, n = 64, 4
    keys = gathered_chunks(seq, n, True)
    for rank in range(n):
        blocks = plan_blocks(rank_chunks(seq, n, rank, True), keys)
        head = [] if rank == n - 1 else [True] if rank == 0 else [False, True]
        assert [b.causal for b in blocks] == head + [False, True]
        run = 2 if rank == n - 1 else 1
        assert all(b.n_queries == run * seq // (2 * n) for b in blocks)


def test_refusals():
    q = k = v = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="dropout_p=0.1"):
        block_causal_forward(q, k, v, [(0, 8)], [(0, 8)], dropout_p=0.1)
    with pytest.raises(ValueError, match="hold 6 positions, the tensor has 8"):
        block_causal_forward(q, k, v, [(0, 6)], [(0, 8)])
    with pytest.raises(ValueError, match="query at position 2 sees no key"):
        block_causal_forward(q, k, v, [(2, 8)], [(4, 8)])
    with pytest.raises(ValueError, match="negative start"):
        plan_blocks([(-1, 8)], [(0, 8)])
    with pytest.raises(ValueError, match="does not split into 8 equal chunks"):
        rank_chunks(100, 4, 0, True)
