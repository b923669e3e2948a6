"""Tracing and the graph JSON (docs/formats.md section 1), single process, no planner."""

import json

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from autoshard.planning.graph_export import encode_arg, graph_dict, graph_json
from autoshard.models import MLP, Llama, LlamaConfig
from autoshard.placements import layout_from_strs, layout_to_strs, local_shape, placement_from_str
from autoshard.trace.tracer import trace_training_step


@pytest.fixture(scope="module")
def mlp_step():
    with torch.device("meta"):
        model = MLP(dim=16, hidden=32, layers=2)
    return trace_training_step(model, lambda: (torch.empty(8, 16), torch.empty(8, 16)))


@pytest.fixture(scope="module")
def llama_step():
    with torch.device("meta"):
        model = Llama(
            LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=64)
        )
    return trace_training_step(
        model, lambda: (torch.zeros(4, 8, dtype=torch.long), torch.zeros(4, 8, dtype=torch.long))
    )


def test_roles_and_original_parameter_names(mlp_step):
    g = graph_dict(mlp_step)
    phs = [n for n in g["nodes"] if n["op"] == "placeholder"]
    params = [n for n in phs if n["role"] == "parameter"]
    assert [p["fqn"] for p in params] == [n for n, _ in MLP(16, 32, 2).named_parameters()]
    assert params[0]["outputs"] == [{"shape": [32, 16], "dtype": "float32"}]
    inputs = [n for n in phs if n["role"] == "input"]
    assert [i["input_index"] for i in inputs] == [0, 1]
    assert inputs[0]["outputs"] == [{"shape": [8, 16], "dtype": "float32"}]
    tangents = [n for n in phs if n["role"] == "tangent"]
    assert len(tangents) == 1 and tangents[0]["tangent_of"] == 0
    assert tangents[0]["outputs"] == [{"shape": [], "dtype": "float32"}]


def test_outputs_are_loss_then_one_grad_per_parameter(mlp_step):
    g = graph_dict(mlp_step)
    outs = g["outputs"]
    assert outs[0]["role"] == "output" and outs[0]["output_index"] == 0
    grads = outs[1:]
    params = {n["name"]: n for n in g["nodes"] if n.get("role") == "parameter"}
    assert sorted(o["grad_of"] for o in grads) == sorted(params)
    by_name = {n["name"]: n for n in g["nodes"]}
    for o in grads:  # each gradient has its parameter's shape
        assert (
            by_name[o["ref"]]["outputs"][o["index"]]["shape"]
            == params[o["grad_of"]]["outputs"][0]["shape"]
        )


def test_every_reference_names_an_earlier_node_and_getitem_is_folded(llama_step):
    g = graph_dict(llama_step)
    seen = {}
    refs = []

    def walk(v):
        if isinstance(v, dict) and "ref" in v:
            refs.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for n in g["nodes"]:
        assert n["op"] != "<built-in function getitem>"
        refs.clear()
        walk(n.get("args", []))
        walk(n.get("kwargs", {}))
        for r in refs:
            assert r["ref"] in seen, f"{n['name']} reads {r['ref']} before it is defined"
            assert 0 <= r["index"] < len(seen[r["ref"]]["outputs"])
            assert seen[r["ref"]]["outputs"][r["index"]] is not None
        seen[n["name"]] = n
    # multi-output ops exist (nll_loss_forward -> (loss, total_weight)) and are read by index
    multi = [n for n in g["nodes"] if len(n["outputs"]) > 1]
    assert any(n["op"] == "aten.nll_loss_forward.default" for n in multi)
    text = graph_json(llama_step)
    assert json.loads(text) == g  # valid JSON (no NaN/Infinity tokens)


def test_phases_sources_and_modules(llama_step):
    g = graph_dict(llama_step)
    ops = [n for n in g["nodes"] if n["op"] != "placeholder"]
    assert {n["phase"] for n in ops} == {"forward", "backward"}
    first_bwd = next(i for i, n in enumerate(ops) if n["phase"] == "backward")
    assert all(n["phase"] == "forward" for n in ops[:first_bwd])
    mms = [n for n in ops if n["op"] == "aten.mm.default" and n["phase"] == "forward"]
    wq = [n for n in mms if n.get("module") == "layers.0.attention.wq"]
    assert wq, "the wq projection's mm should carry its module path"
    assert wq[0]["source"].startswith("models.py:")
    assert "self.wq(x)" in wq[0]["source"]
    # backward nodes carry the forward module too (fwd_nn_module_stack)
    assert any(
        n.get("module") == "layers.1.feed_forward.w2" for n in ops if n["phase"] == "backward"
    )


def test_remembered_source_lines_are_the_parsed_ones(llama_step):
    """source_line remembers the user frame per stack-trace text (user_frames.py); it must be
    the frame parsing each node's own trace gives."""
    from autoshard.user_frames import source_line
    from autoshard.user_frames import parse_stack_trace, user_frame

    nodes = [n for n in llama_step.gm.graph.nodes if n.op == "call_function"]
    assert any(source_line(n) for n in nodes)
    for n in nodes:
        frame = user_frame(parse_stack_trace(n.meta.get("stack_trace")))
        line = source_line(n)
        assert (line is None) == (frame is None)
        if frame is not None:
            assert line.startswith(f"models.py:{frame.lineno} in {frame.name}")


def test_tracing_restores_the_collector_and_dynamos_check():
    """Tracing pauses the garbage collector and skips Dynamo's constraint check (both only
    cost time, tracer.py); both are back afterwards, also when tracing fails."""
    import gc

    from torch._dynamo import functional_export

    check = functional_export._suggest_or_raise_constraint_violation
    with torch.device("meta"):
        model = MLP(dim=16, hidden=32, layers=1)
    trace_training_step(model, lambda: (torch.empty(8, 16), torch.empty(8, 16)))
    assert gc.isenabled()
    assert functional_export._suggest_or_raise_constraint_violation is check
    with pytest.raises(Exception):
        trace_training_step(model, lambda: (torch.empty(8, 15), torch.empty(8, 16)))
    assert gc.isenabled()
    assert functional_export._suggest_or_raise_constraint_violation is check
    gc.disable()  # a caller that turned the collector off keeps it off
    try:
        trace_training_step(model, lambda: (torch.empty(8, 16), torch.empty(8, 16)))
        assert not gc.isenabled()
    finally:
        gc.enable()


class _TiedLM(torch.nn.Module):
    """An embedding and an output projection sharing one weight (GPT-2's wte / lm_head)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.head = torch.nn.Linear(16, 32, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids)).float().pow(2).mean()


def test_dynamo_names_become_fqns_and_tied_weights_keep_the_capture():
    """The AOT descriptors name parameters by their FQNs (Dynamo's own names are
    L__self___emb_weight); renaming breaks the capture of a tensor with two names, so a tied
    model keeps Dynamo's names, but still its capture (source lines, module paths)."""
    with torch.device("meta"):
        mlp, tied = MLP(dim=16, hidden=32, layers=1), _TiedLM()
    step = trace_training_step(mlp, lambda: (torch.empty(8, 16), torch.empty(8, 16)))
    assert step.source_captured
    assert list(step.joint_with_descriptors.params_spec) == [n for n, _ in mlp.named_parameters()]
    step = trace_training_step(tied, lambda: (torch.zeros(4, 8, dtype=torch.long),))
    assert step.source_captured
    assert sorted(step.param_fqns.values()) == ["emb.weight"]
    pytest.importorskip("transformers")
    from autoshard._testing import hf_zoo

    gpt2, inputs = hf_zoo.build("gpt2")  # lm_head.weight is transformer.wte.weight
    assert trace_training_step(gpt2, inputs).source_captured


def test_addmm_is_split_into_mm_and_add(mlp_step):
    ops = {str(n.target) for n in mlp_step.gm.graph.nodes if n.op == "call_function"}
    assert "aten.addmm.default" not in ops and "aten.mm.default" in ops


def test_traced_graph_computes_the_model(mlp_step):
    """The joint graph, run on real tensors, gives the model's loss and gradients."""
    torch.manual_seed(0)
    model = MLP(16, 32, 2)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    loss = model(x, y)
    loss.backward()
    env = {}
    params = dict(model.named_parameters())
    for n in mlp_step.gm.graph.nodes:
        if n.op == "placeholder":
            if n.name in mlp_step.param_fqns:
                env[n.name] = params[mlp_step.param_fqns[n.name]].detach()
            elif n.name in mlp_step.tangent_of:
                env[n.name] = torch.ones(())
            else:
                env[n.name] = (x, y)[mlp_step.input_nodes.index(n.name)]
        elif n.op == "call_function":
            args = torch.fx.node.map_arg(n.args, lambda a: env[a.name])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a.name])
            env[n.name] = n.target(*args, **kwargs)
    for o in mlp_step.outputs:
        val = env[o.node.name]
        if o.role == "output":
            assert torch.allclose(val, loss.detach())
        else:
            fqn = mlp_step.param_fqns[o.grad_of]
            assert torch.allclose(val, params[fqn].grad, rtol=1e-6, atol=1e-7)


def test_encode_args():
    assert encode_arg(1.0) == 1.0 and isinstance(encode_arg(1.0), float)
    assert encode_arg(float("-inf")) == "-inf"
    assert encode_arg(torch.float32) == {"dtype": "float32"}
    assert encode_arg(torch.device("cpu")) == {"device": "cpu"}
    assert encode_arg(torch.strided) == {"layout": "strided"}
    assert encode_arg(torch.contiguous_format) == {"memory_format": "contiguous_format"}
    assert encode_arg([2, [3, None]]) == [2, [3, None]]
    assert json.dumps(encode_arg(2.0)) == "2.0"


def test_placement_strings_round_trip():
    for s in ["R", "S(0)", "S(3)", "P(sum)", "P(avg)", "P(max)", "P(min)"]:
        assert layout_to_strs([placement_from_str(s)]) == [s]
    assert layout_from_strs(["S(0)", "R"], 2) == (Shard(0), Replicate())
    with pytest.raises(ValueError, match="expected 2 placements"):
        layout_from_strs(["R"], 2)
    with pytest.raises(ValueError, match="unknown placement 'S0'"):
        placement_from_str("S0")


def test_local_shape_follows_chunk_semantics():
    # 10 rows on 4 ranks: torch.chunk gives 3,3,3,1
    assert [local_shape([10, 4], [Shard(0)], [4], [r])[0] for r in range(4)] == [3, 3, 3, 1]
    # 5 rows on 4 ranks: 2,2,1,0
    assert [local_shape([5], [Shard(0)], [4], [r])[0] for r in range(4)] == [2, 2, 1, 0]
    # two mesh dims on one tensor dim: split left to right
    assert local_shape([8, 3], [Shard(0), Shard(0)], [2, 2], [1, 0]) == [2, 3]
    assert local_shape([8, 6], [Shard(0), Shard(1)], [2, 3], [0, 2]) == [4, 2]
