"""The local call of causal attention on a block of queries (ops/context_parallel.py): each
rank's block against every key, by the positions it holds (block kernels, or the explicit
positions mask), gives that block of the unsharded causal kernel's outputs, forward and
backward; the offsets of nested shards follow DTensor's chunking mesh dim by mesh dim."""

from __future__ import annotations

import pytest
import torch

from autoshard.ops import context_parallel as cp

FWD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BWD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
aten = torch.ops.aten
FWD_OP = aten._scaled_dot_product_flash_attention_for_cpu.default
BWD_OP = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


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


@pytest.mark.parametrize("with_mask", [False, True])
def test_blocks_of_queries_match_the_unsharded_causal_kernel(with_mask):
    """4 ranks' blocks of queries against every key, by the runtime's local call: the block
    kernels, or (a mask of the call's own, here all zeros) the explicit positions mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64) for _ in range(4))
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, True
    )
    kwargs = {"attn_mask": torch.zeros(4, 16, dtype=torch.float64)} if with_mask else {}
    n, length = 4, 4
    dqs, dk_sum, dv_sum = [], 0, 0
    for r in range(n):
        rows = slice(r * length, (r + 1) * length)
        offset = cp.query_offset(["S(2)"], [n], lambda d: r, 16)
        local = lambda op, args: cp.local_call_at_positions(  # noqa: E731
            str(op), args, kwargs, 16, None, offset, 0, op
        )
        o, l = local(FWD_OP, (q[:, :, rows], k, v, 0.0, True))
        torch.testing.assert_close(o, out[:, :, rows])
        torch.testing.assert_close(l, lse[:, :, rows])
        a, b, c = local(BWD_OP, (grad[:, :, rows], q[:, :, rows], k, v, o, l, 0.0, True))
        dqs.append(a)
        dk_sum, dv_sum = dk_sum + b, dv_sum + c  # Partial(sum) over the ranks
    torch.testing.assert_close(torch.cat(dqs, 2), dq)
    torch.testing.assert_close(dk_sum, dk)
    torch.testing.assert_close(dv_sum, dv)


# ---- the load-balanced (head-tail) order: trace/load_balance.py ----------------------------


def test_head_tail_positions_and_their_inverse():
    from autoshard.trace.load_balance import head_tail_positions, natural_order_index

    pos = head_tail_positions(16, 2)  # 4 chunks of 4: rank 0 chunks 0, 3; rank 1 chunks 1, 2
    assert pos.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    inverse = natural_order_index(16, 2)
    assert torch.equal(pos[inverse], torch.arange(16))
    assert torch.equal(inverse, torch.argsort(pos))


def test_causal_work_is_even_in_head_tail_order_and_not_contiguous():
    """Allowed (query, key) pairs per rank's rows of the causal mask: the acceptance bound
    (max / min <= 1.1) holds in head-tail order; the contiguous split's last rank does
    (2n-1)/n of the even share."""
    from autoshard.trace.load_balance import causal_pairs_per_rank, head_tail_positions

    for n, seq in ((2, 64), (4, 256), (8, 256)):
        balanced = causal_pairs_per_rank(head_tail_positions(seq, n), n)
        assert max(balanced) / min(balanced) <= 1.1, (n, balanced)
        assert len(set(balanced)) == 1  # exactly even: 2n chunk-pairs' worth each
        contiguous = causal_pairs_per_rank(torch.arange(seq), n)
        even = seq * (seq + 1) / 2 / n
        assert contiguous[-1] / even == pytest.approx((2 * n - 1) / n, rel=0.02)


def _run_by_positions(gm, balanced: int, seq: int, *inputs):
    """``gm`` run with its causal attention calls as autoshard's runtime runs them in a
    head-tail step (the whole sequence on this one process)."""
    from autoshard.ops import context_parallel as cp

    class ByPositions(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            op = str(target)
            if cp.needs_local_call(op, args, None, balanced):
                return cp.local_call_at_positions(op, args, kwargs, seq, balanced, 0, 0, target)
            return super().call_function(target, args, kwargs)

    return ByPositions(gm).run(*inputs)


@pytest.mark.parametrize(
    "attention,positions", [("sdpa", False), ("manual", False), ("sdpa", True)]
)
def test_the_head_tail_trace_computes_the_model(attention, positions):
    """A Llama traced with the sequence in head-tail order (inputs permuted, rotary tables
    from permuted positions, causal attention over positions: SDPA's causal call run by the
    runtime's local call on the positions it holds, or the hand-built triu) computes the
    model's loss; with the positions left in storage order it does not. With a positions
    input (permuted like the tokens) the rotary angles come from it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from autoshard.models import Llama, LlamaConfig
    from autoshard.trace.load_balance import LoadBalance

    cfg = LlamaConfig(
        dim=32,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=64,
        ffn_dim=64,
        max_seq_len=32,
        attention=attention,
    )
    torch.manual_seed(0)
    model = Llama(cfg)
    inputs = tuple(torch.randint(0, 64, (2, 32)) for _ in range(2))
    if positions:
        inputs += (None, torch.arange(32).expand(2, 32))  # no attention_masks; positions
    lb = LoadBalance(4)
    seq = lb.sequence_length(inputs[:2], {})
    wrapped = lb.wrap(model, seq)
    traced = make_fx(wrapped, decomposition_table=lb.decompositions(seq))(*inputs)
    targets = {str(n.target) for n in traced.graph.nodes}
    assert "aten.index_select.default" in targets
    torch.testing.assert_close(_run_by_positions(traced, 4, seq, *inputs), model(*inputs))
    if not positions:
        permuted_only = make_fx(wrapped)(*inputs)  # positions not permuted: wrong
        assert not torch.allclose(permuted_only(*inputs), model(*inputs))


def test_load_balance_errors_and_fallback(caplog):
    from autoshard.trace.load_balance import LoadBalance, LoadBalanceError, load_balance_for

    tokens = torch.zeros(2, 20, dtype=torch.long)
    with pytest.raises(LoadBalanceError, match="sequence length 20 .* 2 x cp = 8 chunks"):
        LoadBalance(4, strict=True).sequence_length((tokens,), {})
    assert LoadBalance(4).sequence_length((tokens,), {}) is None  # contiguous, warned
    assert "using the contiguous split" in caplog.text
    assert LoadBalance(2).sequence_length((tokens,), {}) == 20
    assert load_balance_for(None, (2, 4), ("dp", "cp")) == LoadBalance(4)
    assert load_balance_for(True, (4,), ("cp",)) == LoadBalance(4, strict=True)
    assert load_balance_for(None, (4,), ("dp",)) is None
    assert load_balance_for(False, (4,), ("cp",)) is None
    with pytest.raises(LoadBalanceError, match="needs a mesh dim named 'cp'"):
        load_balance_for(True, (4,), ("dp",))


def test_a_causal_kernel_without_a_rewrite_is_refused():
    from autoshard.trace.load_balance import LoadBalance, LoadBalanceError

    table = LoadBalance(2).decompositions(16)
    refuse = table[aten._scaled_dot_product_efficient_attention.default]
    q = torch.zeros(1, 1, 16, 8)
    with pytest.raises(LoadBalanceError, match="no load-balanced form"):
        refuse(q, q, q, None, False, 0.0, True)
    assert refuse(q, q, q, None, False, 0.0, False) is NotImplemented


class _CausalOverAPrefix(torch.nn.Module):
    """Causal attention whose queries are a prefix of the sequence: positions the load
    balancer cannot name (its rewrite refuses the call)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, tokens, labels):
        x = self.emb(tokens).unsqueeze(1)  # [B, 1, S, 8]
        a = torch.nn.functional.scaled_dot_product_attention(x[:, :, :4], x, x, is_causal=True)
        return a.float().mean() + 0 * labels.sum()


def test_a_model_the_order_cannot_apply_to_is_traced_contiguous_or_refused(caplog):
    from autoshard.trace.load_balance import LoadBalance, LoadBalanceError
    from autoshard.trace.tracer import trace_training_step

    inputs = lambda: tuple(torch.zeros(2, 16, dtype=torch.long) for _ in range(2))  # noqa: E731
    step = trace_training_step(_CausalOverAPrefix(), inputs, load_balance=LoadBalance(2))
    assert step.load_balance is None  # natural order, with a warning naming why
    assert "4 queries and 16 keys" in caplog.text and "contiguous split instead" in caplog.text
    with pytest.raises(LoadBalanceError, match="4 queries and 16 keys"):
        trace_training_step(_CausalOverAPrefix(), inputs, load_balance=LoadBalance(2, True))


def test_a_deep_model_is_extrapolated_in_head_tail_order():
    """The block extrapolation (3 and 4 layers traced, the rest extrapolated, checked against
    the 4-layer trace) keeps the order: the permutation and the causal calls (over head-tail
    positions, no mask in the graph) are per layer alike."""
    from autoshard.models import Llama, LlamaConfig
    from autoshard.trace.load_balance import LoadBalance
    from autoshard.trace.tracer import trace_training_step

    cfg = LlamaConfig(
        dim=16, n_layers=6, n_heads=2, vocab_size=32, ffn_dim=32, max_seq_len=16, attention="sdpa"
    )
    with torch.device("meta"):
        model = Llama(cfg)
    inputs = lambda: tuple(torch.zeros(1, 16, dtype=torch.long) for _ in range(2))  # noqa: E731
    step = trace_training_step(model, inputs, load_balance=LoadBalance(2))
    assert step.joint_with_descriptors is None  # extrapolated (a full trace keeps its own)
    assert step.load_balance == LoadBalance(2)
    flash = [n for n in step.gm.graph.nodes if "flash_attention_for_cpu" in str(n.target)]
    assert len(flash) == 2 * cfg.n_layers
    causal_at = [7 if "backward" in str(n.target) else 4 for n in flash]
    assert all(len(n.args) > at and n.args[at] for n, at in zip(flash, causal_at))
    assert all(n.kwargs.get("attn_mask") is None for n in flash)


def test_an_input_with_the_sequence_in_two_dims_is_refused():
    from autoshard.trace.load_balance import LoadBalance, LoadBalanceError

    step = LoadBalance(2).wrap(torch.nn.Identity(), 8)
    with pytest.raises(LoadBalanceError, match=r"shape \[1, 8, 8\] has the sequence length 8"):
        step(torch.zeros(1, 8, 8))
    x = torch.randn(1, 8, 4)
    assert torch.equal(step(x), x)  # a sequence output is put back in natural order


def _document_pairs_per_rank(order: torch.Tensor, lengths: list[int], n: int) -> list[int]:
    """The causal pairs within documents of each rank's queries, the sequence stored in
    ``order`` (a position per storage index) and split evenly over ``n`` ranks."""
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[order]
    allowed = (order.unsqueeze(0) <= order.unsqueeze(1)) & (doc.unsqueeze(0) == doc.unsqueeze(1))
    return [int(rows.sum()) for rows in allowed.chunk(n, dim=0)]


@pytest.mark.parametrize("lengths,n", [([96, 64, 96], 4), ([16, 240], 4), ([48, 24, 24], 3)])
def test_the_per_document_order_balances_a_document_mask(lengths, n):
    from autoshard.trace.load_balance import document_head_tail_order, head_tail_positions

    order = document_head_tail_order(lengths, n)
    assert sorted(order.tolist()) == list(range(sum(lengths)))  # a permutation
    pairs = _document_pairs_per_rank(order, lengths, n)
    assert max(pairs) == min(pairs), pairs  # every document split head-tail: equal work
    whole = _document_pairs_per_rank(head_tail_positions(sum(lengths), n), lengths, n)
    assert max(whole) > max(pairs)  # the whole sequence's head-tail order is uneven here


def test_the_per_document_order_refuses_documents_it_cannot_split():
    from autoshard.trace.load_balance import LoadBalanceError, document_head_tail_order

    with pytest.raises(LoadBalanceError, match=r"\[100\].*multiple of 8"):
        document_head_tail_order([160, 100], 4)
