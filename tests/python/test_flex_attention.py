"""FlexAttention with a BlockMask passed as a model input (as torchtitan's trainer calls its
models): traced (the higher-order ops folded into nodes with tensor arguments,
python/autoshard/ops/flex_attention.py), planned with the batch / head rows of
cpp/src/rules/flex_attention.cpp, and run on local shards, on CPU as the dense math.
The 4-rank training runs are in test_torchtitan_dist.py."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from autoshard import _core, dense_flex_attention_on_cpu
from autoshard.planning.graph_export import graph_dict
from autoshard.trace.tracer import UnsupportedModelError, trace_training_step
from conftest import assert_attention_split_on_virtual_8x8

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

B, H, S, D = 4, 4, 256, 16


class FlexBlock(nn.Module):
    """Attention through flex_attention with the caller's block mask, then a projection."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(H * D, 3 * H * D)
        self.out = nn.Linear(H * D, H * D)

    def forward(self, x, block_mask):
        q, k, v = self.qkv(x).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
        o = flex_attention(q, k, v, block_mask=block_mask)
        return self.out(o.transpose(1, 2).flatten(2)).pow(2).mean()


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _inputs(mask_batch: int = B):
    x = torch.randn(B, S, H * D)
    return x, create_block_mask(_causal, mask_batch, None, S, S, device="cpu")


def _flex_nodes(graph: dict) -> list[dict]:
    return [n for n in graph["nodes"] if n["op"].startswith("higher_order.flex_attention")]


def test_block_mask_is_a_graph_input_and_the_ops_take_tensor_arguments():
    step = trace_training_step(FlexBlock(), _inputs(), extrapolate_layers=False)
    # x, then the block mask's kv / q tensors (with their full-block pairs)
    assert len([n for n in step.input_nodes if n]) == 1 + 8
    graph = graph_dict(step)
    ops = sorted(n["op"] for n in _flex_nodes(graph))
    assert ops == ["higher_order.flex_attention", "higher_order.flex_attention_backward"]
    assert not step.gm.graph.find_nodes(op="get_attr")  # sub-graphs held by the node target
    forward = next(n for n in _flex_nodes(graph) if n["phase"] == "forward")
    assert forward["args"][3] == "score_mod" and forward["args"][4][-1] == "mask_mod"


def test_cpu_backward_refused_by_torch_runs_as_dense_math_in_context():
    x, bm = _inputs()
    q = torch.randn(B, H, S, D, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, q, q, block_mask=bm)
    with dense_flex_attention_on_cpu():
        got = flex_attention(q, q, q, block_mask=bm)
    want = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_batch", [B, 1])
def test_mask_follows_the_batch_row_or_stays_replicated_where_it_broadcasts(mask_batch):
    from autoshard._testing.capture import enumerate_strategies

    step = trace_training_step(FlexBlock(), _inputs(mask_batch), extrapolate_layers=False)
    graph = graph_dict(step)
    strategies = enumerate_strategies(graph, [4])["nodes"]
    for node in _flex_nodes(graph):
        n_activations = 3 if node["phase"] == "forward" else 6
        rows = {}
        for st in strategies[node["name"]]:
            q, masks = st["inputs"][0][0], [m[0] for m in st["inputs"][n_activations:]]
            rows[q] = masks
            activations = [a[0] for a in st["inputs"][:n_activations]]
            if q == "S(2)":  # the sequence row: k and v gathered whole, the rest split
                assert activations[1:3] == ["R", "R"], st
                del activations[1:3]
            assert set(activations) == {q}, st  # q, k, v (and out, lse, grad_out) together
        assert sorted(rows) == ["R", "S(0)", "S(1)", "S(2)"], rows  # batch, heads, sequence
        assert rows["S(0)"] == (["S(0)"] if mask_batch == B else ["R"]) * 8, rows
        assert rows["S(1)"] == ["R"] * 8, rows  # the mask broadcasts over the heads
        assert rows["S(2)"] == ["R"] * 8, rows  # read whole, by position


def _same_document(doc, b, h, q_idx, kv_idx):
    return doc[b, q_idx] == doc[b, kv_idx]


class SameDocument:
    def __init__(self, doc: torch.Tensor):
        self.doc = doc

    def __call__(self, b, h, q_idx, kv_idx):
        return _same_document(self.doc, b, h, q_idx, kv_idx)


def _document_mask(doc: torch.Tensor, captured_by: str = "closure"):
    """A causal mask within the documents of ``doc`` (B, S), its mask_mod capturing the
    table: a closure (torchtitan's packed-document masks), a partial, or a callable object
    (whose attributes torch does not flatten)."""
    from torch.nn.attention.flex_attention import and_masks

    if captured_by == "closure":

        def same_document(b, h, q_idx, kv_idx):
            return doc[b, q_idx] == doc[b, kv_idx]

    elif captured_by == "partial":
        same_document = functools.partial(_same_document, doc)
    else:
        same_document = SameDocument(doc)
    return create_block_mask(and_masks(_causal, same_document), B, None, S, S, device="cpu")


def _document_inputs(captured_by: str = "closure"):
    doc = torch.zeros(B, S, dtype=torch.int32)
    doc[:, S // 3 :] = 1
    return torch.randn(B, S, H * D), _document_mask(doc, captured_by), torch.randn(B, S, H * D)


class FlexBlockWithTarget(FlexBlock):
    """An input after the mask: the one a misnumbered closure tensor would take the place of."""

    def forward(self, x, block_mask, target):
        q, k, v = self.qkv(x).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
        o = flex_attention(q, k, v, block_mask=block_mask)
        return (self.out(o.transpose(1, 2).flatten(2)) - target).pow(2).mean()


@pytest.mark.parametrize("captured_by", ["closure", "partial"])
def test_tensors_a_mask_mod_captures_are_graph_inputs_numbered_as_a_call_flattens_them(
    captured_by,
):
    inputs = _document_inputs(captured_by)
    step = trace_training_step(FlexBlockWithTarget(), inputs, extrapolate_layers=False)
    assert step.source_captured  # Dynamo's capture, its inputs renumbered
    flat = torch.utils._pytree.tree_leaves(inputs)
    assert len(flat) == 1 + 8 + 1 + 1 and all(step.input_nodes)
    placeholders = {n.name: n.meta["val"] for n in step.gm.graph.find_nodes(op="placeholder")}
    for value, name in zip(flat, step.input_nodes):  # each input's node has its shape
        got = placeholders[name]
        assert (got.shape, got.dtype) == (value.shape, value.dtype), name
    assert not [n for n in step.gm.graph.find_nodes(op="get_attr") if "cell_contents" in n.target]
    forward = next(n for n in _flex_nodes(graph_dict(step)) if n["phase"] == "forward")
    assert step.input_nodes[9] in str(forward["args"][-1])  # the mask_mod's buffer


def test_a_mask_mod_that_is_a_callable_object_is_refused_clearly():
    # alone, its tensor is in no flattening: it would be a constant of the graph
    doc = torch.zeros(B, S, dtype=torch.int32)
    mask = create_block_mask(SameDocument(doc), B, None, S, S, device="cpu")
    x, _, target = _document_inputs()
    with pytest.raises(UnsupportedModelError, match="an attribute of a callable object"):
        trace_training_step(FlexBlockWithTarget(), (x, mask, target))
    # captured by and_masks' closure, torch flattens the object itself as one value
    with pytest.raises(NotImplementedError, match="captures a SameDocument"):
        trace_training_step(FlexBlockWithTarget(), _document_inputs("object"))


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan missing")
@pytest.mark.parametrize("mask", ["causal", "document"])
def test_torchtitan_llama3_debug_model_plans_on_a_virtual_8x8_mesh(mask):
    from torchtitan.models.common.attention import get_causal_mask_mod
    from torchtitan.models.llama3 import llama3_configs

    cfg = llama3_configs["debugmodel"]("flex")
    cfg.layers = cfg.layers[:2]
    with torch.device("meta"):
        model = cfg.build()
    batch, seq = 16, 256

    def input_fn():  # as torchtitan's trainer calls the model: tokens, positions, block mask
        if mask == "causal":
            positions = torch.arange(seq).repeat(batch, 1)
            block_mask = create_block_mask(
                get_causal_mask_mod(), batch, None, seq, seq, device="cpu"
            )
        else:  # packed documents of 100 tokens; torchtitan's own mask (compiled, run eagerly)
            positions = (torch.arange(seq) % 100).repeat(batch, 1)
            with torch.compiler.set_stance("force_eager"):
                block_mask = model.get_attention_masks(positions)
        return torch.randint(0, 2048, (batch, seq)), positions, block_mask

    # forward and backward of 2 layers
    n_inputs = assert_attention_split_on_virtual_8x8(model, input_fn, "flex_attention", n_calls=4)
    assert n_inputs == (10 if mask == "causal" else 11)  # + the document-end table


def test_compile_is_refused_clearly_for_a_program_with_flex_attention():
    """torch.compile does not take the per-rank program's FlexAttention calls (their buffers
    are arguments; Dynamo wants the front end's closures): a clear refusal, not Dynamo's
    "too many values to unpack"."""
    from types import SimpleNamespace

    import torch.fx as fx

    from autoshard.program.execution import compile_program

    def program_with(target) -> fx.GraphModule:
        graph = fx.Graph()
        x = graph.placeholder("x")
        graph.output(graph.call_function(target, (x,)))
        return fx.GraphModule({}, graph)

    plain = program_with(torch.ops.aten.relu.default)
    flex = program_with(torch.ops.higher_order.flex_attention)
    with pytest.raises(NotImplementedError, match="compile=False"):
        compile_program(SimpleNamespace(fwd=flex, bwd=plain))
