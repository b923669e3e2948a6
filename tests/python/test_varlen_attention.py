"""Variable-length attention (torch.nn.attention.varlen, torchtitan's "varlen" backend): the CPU
kernels of ops/varlen_attention.py against per-document SDPA, the head and token rows of
cpp/src/rules/varlen_attention.cpp, a token block's document offsets, and (slow) a Llama with
varlen attention trained on 4 gloo ranks with its attention split by heads (tp) and by blocks
of whole batch rows (dp), equal to the single-process model."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.varlen import varlen_attn

from autoshard import _core, varlen_attention_on_cpu
from conftest import assert_attention_split_on_virtual_8x8, run_torchrun, trained_like_reference

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

T, H, HK, D = 40, 4, 2, 8
DOCUMENTS = [(0, 15), (15, 40)]


def _per_document_sdpa(q, k, v, causal: bool):
    outs = []
    for start, end in DOCUMENTS:
        qd, kd, vd = (x[start:end].transpose(0, 1)[None] for x in (q, k, v))
        kd, vd = (x.repeat_interleave(H // HK, dim=1) for x in (kd, vd))
        outs.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)[0])
    return torch.cat([o.transpose(0, 1) for o in outs])


@pytest.mark.parametrize("causal", [True, False])
def test_cpu_kernels_are_per_document_attention(causal):
    varlen_attention_on_cpu()
    torch.manual_seed(0)
    q = torch.randn(T, H, D, requires_grad=True)
    k, v = (torch.randn(T, HK, D, requires_grad=True) for _ in range(2))
    cu = torch.tensor([0, 15, 40], dtype=torch.int32)
    window = (-1, 0) if causal else (-1, -1)
    got = varlen_attn(q, k, v, cu, cu, 25, 25, window_size=window, enable_gqa=True)
    want = _per_document_sdpa(q, k, v, causal)
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(got)
    torch.testing.assert_close(
        torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)
    )


def test_a_token_block_gets_the_offsets_of_its_documents_and_refuses_a_cut_one():
    from autoshard.ops.varlen_attention import local_offsets

    cu = torch.tensor([0, 20, 64, 100, 128], dtype=torch.int32)
    assert local_offsets(cu, 64, 64).tolist() == [0, 0, 0, 36, 64]  # outside: empty
    assert local_offsets(cu, 0, 64).tolist() == [0, 20, 64, 64, 64]
    with pytest.raises(RuntimeError, match="crosses the edge of a rank's block"):
        local_offsets(cu, 32, 32)


def test_cpu_kernels_refuse_window_attention():
    varlen_attention_on_cpu()
    q = torch.randn(T, H, D)
    cu = torch.tensor([0, 40], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="full or causal attention only"):
        varlen_attn(q, q, q, cu, cu, 40, 40, window_size=(8, 0))


def test_attention_splits_by_heads_or_tokens_and_reads_the_offsets_whole():
    from autoshard._testing.capture import enumerate_strategies
    from autoshard.models import Llama, LlamaConfig
    from autoshard.planning.graph_export import graph_dict
    from autoshard.trace.tracer import trace_training_step

    cfg = LlamaConfig(dim=32, n_heads=4, n_kv_heads=2, max_seq_len=32, attention="varlen")
    tokens = torch.zeros(2, 32, dtype=torch.long)
    masks = (torch.tensor([0, 10, 32, 64], dtype=torch.int32), 32)
    step = trace_training_step(Llama(cfg), (tokens, tokens, masks), extrapolate_layers=False)
    graph = graph_dict(step)
    strategies = enumerate_strategies(graph, [2])["nodes"]  # blocks of one batch row
    varlen = [n for n in graph["nodes"] if n["op"].startswith("torch_attn._varlen_attn")]
    assert len(varlen) == 4  # two layers, forward and backward
    for node in varlen:
        rows = {st["outputs"][0][0]: st for st in strategies[node["name"]]}
        assert sorted(rows) == ["R", "S(0)", "S(1)"], rows  # replicated, tokens, heads
        if "backward" in node["op"]:  # the token row: the logsumexp [H, T] on its dim 1
            assert [p[0] for p in rows["S(0)"]["inputs"]][:6] == ["S(0)"] * 5 + ["S(1)"]
        if "backward" in node["op"]:  # grad_out, q, k, v, out; logsumexp [H, T]; offsets, rng
            want = ["S(1)"] * 5 + ["S(0)"] + ["R"] * 3
        else:  # q, k, v; the offsets
            want = ["S(1)"] * 3 + ["R"] * 2
        assert [p[0] for p in rows["S(1)"]["inputs"]] == want, (node["op"], rows["S(1)"])


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan missing")
def test_torchtitan_llama3_varlen_debug_model_plans_on_a_virtual_8x8_mesh():
    """torchtitan's varlen model, called as its trainer calls it (tokens, positions, the
    packed documents' VarlenMetadata, with the row length as the fixed bound): attention is
    split, by tokens (whole batch rows) or heads, on some mesh dim."""
    from torchtitan.models.llama3 import llama3_configs

    cfg = llama3_configs["debugmodel"]("varlen")
    cfg.layers = cfg.layers[:2]
    with torch.device("meta"):
        model = cfg.build()
    batch, seq = 16, 256
    positions = (torch.arange(seq) % 100).repeat(batch, 1)  # documents of 100 tokens
    found = model.get_attention_masks(positions)  # data-dependent: built outside the trace
    masks = type(found)(found.cu_seq_q, found.cu_seq_k, seq, seq)
    inputs = (torch.randint(0, 2048, (batch, seq)), positions, masks)
    # forward and backward of 2 layers
    assert_attention_split_on_virtual_8x8(model, inputs, "_varlen_attn", n_calls=4)


SCENARIOS = [
    {"name": "tp4", "mesh": [4], "dims": ["tp"], "seq": 64, "documents": [[20, 44], [64]]},
    {
        "name": "dp2_tp2",
        "mesh": [2, 2],
        "dims": ["dp", "tp"],
        "seq": 64,
        "documents": [[20, 44], [30, 30, 4]],
    },
    {
        "name": "dp4",
        "mesh": [4],
        "dims": ["dp"],
        "seq": 32,
        "documents": [[20, 12], [32], [5, 5, 22], [16, 16]],
    },
]
ROW = {"tp": "S(1)", "dp": "S(0)"}  # the head row on tp, the token row on dp


def by_name_scenario(name: str) -> dict:
    return next(s for s in SCENARIOS if s["name"] == name)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun("varlen_worker.py", SCENARIOS, tmp_path_factory.mktemp("varlen"))


@pytest.mark.slow
@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_varlen_llama_trains_like_single_process_split_by_heads_or_tokens(results, name):
    attention = trained_like_reference(results, name)[0]["attention"]
    want = [ROW[d] for d in by_name_scenario(name)["dims"]]
    for node, e in attention.items():
        assert e["inputs"][0] == want and e["outputs"][0] == want, (node, e)
