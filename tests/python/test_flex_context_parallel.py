"""FlexAttention on a shard of the sequence (context parallelism): the mods called at the
global positions a rank's queries and keys hold (flex_attention.FlexAttentionCall
.call_at_positions, reached through ops/context_parallel.local_call_at_positions), checked
against the whole call: each rank's rows of out / logsumexp / dq, and dk / dv summed over the
ranks, for a causal document mask and a relative-position score_mod, in the contiguous and
the head-tail splits. The 4-rank training runs are in test_context_parallel_dist.py."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from autoshard.ops import attention_blocks
from autoshard.ops import context_parallel as cp
from autoshard.ops.flex_attention import FlexAttentionCall, LocalBlockMasks, local_block_mask

B, H, S, D = 2, 2, 64, 8
FWD, BWD = cp.FLEX_ATTENTION_OPS


def _documents() -> torch.Tensor:
    doc = torch.zeros(B, S, dtype=torch.int64)
    doc[0, 20:] = 1
    doc[0, 45:] = 2
    doc[1, 33:] = 1
    return doc


def _mask_mod(b, h, q_idx, kv_idx, doc):
    return (kv_idx <= q_idx) & (doc[b, q_idx] == doc[b, kv_idx])


def _score_mod(score, b, h, q_idx, kv_idx):
    return score - 0.05 * (q_idx - kv_idx)  # a relative-position bias reads the positions


def _joint(score, b, h, q_idx, kv_idx, grad):
    return [grad, None, None, None, None]  # d(score_mod)/d(score) is 1 (a list, as make_fx gives)


def _block_mask(doc: torch.Tensor) -> tuple:
    bm = create_block_mask(
        lambda b, h, q, kv: _mask_mod(b, h, q, kv, doc), B, None, S, S, device="cpu"
    )
    return (*bm.as_tuple()[:-1], "mask_mod")


def _calls():
    graphs = {"mask_mod": _mask_mod}
    forward = FlexAttentionCall("flex_attention", {**graphs, "score_mod": _score_mod}, {})
    backward = FlexAttentionCall(
        "flex_attention_backward", {**graphs, "fw_graph": _score_mod, "joint_graph": _joint}, {}
    )
    return forward, backward


def _whole(doc, q, k, v, grad_out):
    forward, backward = _calls()
    block_mask = _block_mask(doc)
    out, lse, _ = forward(q, k, v, "score_mod", block_mask, 0.3, None, (), (doc,))
    grads = backward(
        q, k, v, out, lse, grad_out, torch.zeros_like(lse), "fw_graph", "joint_graph",
        block_mask, 0.3, None, (), (doc,),
    )  # fmt: skip
    return out, lse, grads[:3]


@pytest.mark.parametrize("ranks,balanced", [(2, None), (4, None), (2, 2), (4, 4)])
def test_shards_at_their_positions_make_up_the_whole_call(ranks, balanced):
    torch.manual_seed(0)
    doc = _documents()
    q, k, v, grad_out = (torch.randn(B, H, S, D, dtype=torch.float64) for _ in range(4))
    out, lse, (dq, dk, dv) = _whole(doc, q, k, v, grad_out)
    stored = cp.storage_chunks(S, balanced)
    # the whole sequence in storage order, as the trace of a head-tail step holds it
    order = attention_blocks.chunk_positions(stored)
    qs, ks, vs, gs = (t[:, :, order] for t in (q, k, v, grad_out))
    forward, backward = _calls()
    block_mask = _block_mask(doc)
    n = S // ranks
    dk_sum, dv_sum = torch.zeros_like(dk), torch.zeros_like(dv)
    for r in range(ranks):
        rows = slice(r * n, (r + 1) * n)  # the rank's storage elements
        pos = order[rows]

        def at_positions(op, args):
            call = forward if op == FWD else backward
            return cp.local_call_at_positions(op, args, {}, S, balanced, r * n, 0, call)

        o_r, lse_r, _ = at_positions(
            FWD, (qs[:, :, rows], ks, vs, "score_mod", block_mask, 0.3, None, (), (doc,))
        )
        torch.testing.assert_close(o_r, out[:, :, pos])
        torch.testing.assert_close(lse_r, lse[:, :, pos])
        dq_r, dk_r, dv_r, buffer_grads = at_positions(
            BWD,
            (
                qs[:, :, rows], ks, vs, o_r, lse_r, gs[:, :, rows], torch.zeros_like(lse_r),
                "fw_graph", "joint_graph", block_mask, 0.3, None, (), (doc,),
            ),
        )  # fmt: skip
        assert buffer_grads == []  # the positions' are dropped
        torch.testing.assert_close(dq_r, dq[:, :, pos])
        dk_sum[:, :, order] += dk_r  # this rank's queries' part (a Partial sum)
        dv_sum[:, :, order] += dv_r
    torch.testing.assert_close(dk_sum, dk)
    torch.testing.assert_close(dv_sum, dv)


def test_needs_a_positions_call_on_a_sequence_shard_or_in_head_tail_order():
    args = (None,) * 9
    assert cp.needs_local_call(FWD, args, [["S(2)"], ["R"], ["R"]], None)
    assert cp.needs_local_call(BWD, args, [["S(0)"], ["S(0)"], ["S(0)"]], 2)
    assert not cp.needs_local_call(FWD, args, [["S(0)"], ["S(0)"], ["S(0)"]], None)
    assert not cp.needs_local_call(FWD, args, None, None)


def test_block_tensors_rebuilt_for_the_positions_a_gpu_kernel_reads():
    """Off the CPU the kernels skip blocks by the block mask's tensors: the ones rebuilt for
    a rank's positions equal a mask built directly for those positions."""
    doc = _documents()
    stored = cp.storage_chunks(S, 2)
    order = attention_blocks.chunk_positions(stored)
    q_pos, k_pos = order[S // 2 :], order
    q = torch.zeros(B, H, S // 2, D)
    k = torch.zeros(B, H, S, D)
    mask_mod = lambda b, h, qi, ki, d, qp, kp: _mask_mod(b, h, qp[qi], kp[ki], d)  # noqa: E731
    rebuilt = local_block_mask(
        (*_block_mask(doc)[:-3], 16, 16, mask_mod), (doc, q_pos, k_pos), q, k
    )
    direct = create_block_mask(
        lambda b, h, qi, ki: _mask_mod(b, h, q_pos[qi], k_pos[ki], doc),
        B, H, S // 2, S, device="cpu", BLOCK_SIZE=16,
    )  # fmt: skip
    for got, want in zip(rebuilt[:-1], direct.as_tuple()[:-1]):
        if isinstance(want, torch.Tensor):
            assert torch.equal(got, want)
        else:
            assert got == want


def test_a_rebuilt_block_mask_serves_the_calls_with_the_same_inputs():
    """The block tensors rebuilt for a rank's positions are kept for the next calls (every
    layer, forward and backward) with the same mask buffers and positions, and rebuilt when a
    buffer is another tensor or was written in place, or the positions differ."""
    torch.manual_seed(0)
    doc = _documents()
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64) for _ in range(3))
    forward, _ = _calls()
    block_mask = _block_mask(doc)
    stored = cp.storage_chunks(S, 2)
    order = attention_blocks.chunk_positions(stored)
    masks = LocalBlockMasks()

    def call(doc, start, cache=masks):
        args = (q[:, :, start : start + S // 2], k, v, "score_mod", block_mask, 0.3, None, (), (doc,))  # fmt: skip
        pos = order[start : start + S // 2]
        key = (tuple(stored), start, 0)
        return forward.call_at_positions(
            args, pos, order, rebuild_blocks=True, block_masks=cache, positions_key=key
        )[0]

    uncached = call(doc, 0, cache=None)
    for _ in range(3):  # the layers' calls
        torch.testing.assert_close(call(doc, 0), uncached)
    assert masks.built == 1
    call(doc.clone(), 0)  # the next step's document table
    assert masks.built == 2
    call(doc, S // 2)  # the other rank's positions
    assert masks.built == 3
    doc[1, 40:] = 2  # written in place: its blocks may change
    torch.testing.assert_close(call(doc, 0), call(doc, 0, cache=None))
    assert masks.built == 4


def test_mask_graphs_are_one_mask_by_code_and_the_constants_they_read():
    """Layers' mask graphs share kept block masks when their code and the tensors they read
    as attributes are the same; the same code reading another tensor is another mask."""
    from autoshard.ops.flex_attention import _mask_identity

    class Mask(torch.nn.Module):
        def __init__(self, keep: torch.Tensor):
            super().__init__()
            self.keep = keep

        def forward(self, b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & self.keep[kv_idx]

    keep = torch.ones(S, dtype=torch.bool)
    first, again = (torch.fx.symbolic_trace(Mask(keep)) for _ in range(2))
    other = torch.fx.symbolic_trace(Mask(keep.clone()))
    assert first is not again and first.code == other.code
    assert _mask_identity(first) == _mask_identity(again)
    assert _mask_identity(first) != _mask_identity(other)
    assert _mask_identity(_mask_mod) is _mask_mod  # a plain function is itself
