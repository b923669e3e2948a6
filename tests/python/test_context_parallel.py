"""The local call of causal attention on a block of queries (ops/context_parallel.py): each
rank's block against every key, with the mask offset by the block's first position, gives
that block of the unsharded causal kernel's outputs, forward and backward; the offsets of
nested shards follow DTensor's chunking mesh dim by mesh dim."""

from __future__ import annotations

import torch

from autoshard.ops import context_parallel as cp

FWD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BWD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
aten = torch.ops.aten


def test_query_offset_nests_mesh_dims_in_order():
    coord = {0: 1, 1: 1}.__getitem__
    assert cp.query_offset(["S(2)", "S(2)"], [2, 2], coord, 16) == 8 + 4
    assert cp.query_offset(["S(0)", "S(2)"], [2, 4], coord, 16) == 4
    assert cp.query_offset(["R", "R"], [2, 2], coord, 16) == 0


def test_needs_offset_only_for_causal_calls_with_sharded_queries():
    args = (None, None, None, 0.0, True)
    assert cp.needs_offset(FWD, args, [["S(2)"], ["R"], ["R"]])
    assert not cp.needs_offset(FWD, args, [["S(0)"], ["S(0)"], ["S(0)"]])
    assert not cp.needs_offset(FWD, (None, None, None, 0.0, False), [["S(2)"], ["R"], ["R"]])
    assert not cp.needs_offset(FWD, args, None)


def test_blocks_of_queries_match_the_unsharded_causal_kernel():
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64) for _ in range(4))
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, True
    )
    n, length = 4, 4
    dqs, dk_sum, dv_sum = [], 0, 0
    for r in range(n):
        rows = slice(r * length, (r + 1) * length)
        offset = cp.query_offset(["S(2)"], [n], lambda d: r, 16)
        args, kwargs = cp.causal_offset_call(FWD, (q[:, :, rows], k, v, 0.0, True), {}, offset)
        o, l = aten._scaled_dot_product_flash_attention_for_cpu(*args, **kwargs)
        torch.testing.assert_close(o, out[:, :, rows])
        torch.testing.assert_close(l, lse[:, :, rows])
        bargs = (grad[:, :, rows], q[:, :, rows], k, v, o, l, 0.0, True)
        args, kwargs = cp.causal_offset_call(BWD, bargs, {}, offset)
        a, b, c = aten._scaled_dot_product_flash_attention_for_cpu_backward(*args, **kwargs)
        dqs.append(a)
        dk_sum, dv_sum = dk_sum + b, dv_sum + c  # Partial(sum) over the ranks
    torch.testing.assert_close(torch.cat(dqs, 2), dq)
    torch.testing.assert_close(dk_sum, dk)
    torch.testing.assert_close(dv_sum, dv)
