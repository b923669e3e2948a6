"""Runtime paths on a one-rank gloo mesh (real process group, in this process): buffers,
keyword inputs, several outputs, unused outputs, input gradients, recorded plans."""

import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autoshard.runtime.module_state import load_full_state_dict

from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.program.interpreter import PlanMismatchError
from autoshard.trace.traced_step import ForwardInputs
from autoshard.trace.tracer import trace_training_step
from autoshard.runtime.module_runtime import runtime_of


class WithBuffer(nn.Module):
    """A buffer, a keyword input, and two outputs (loss and an auxiliary tensor)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 6))

    def forward(self, x, *, shift):
        h = torch.tanh(self.lin(x) * self.scale + shift)
        return h.pow(2).mean(), h.detach().sum(0)


def _trace(model_meta):
    return trace_training_step(
        model_meta,
        lambda: ForwardInputs(args=(torch.empty(4, 6),), kwargs={"shift": torch.empty(6)}),
    )


def test_buffers_kwargs_and_several_outputs(mesh1):
    torch.manual_seed(0)
    ref = WithBuffer()
    with torch.device("meta"):
        meta = WithBuffer()
    step = _trace(meta)
    assert list(step.buffer_fqns.values()) == ["scale"]
    assert step.num_forward_outputs == 2
    par = build_parallel_module(meta, step, {"nodes": {}}, mesh1, strict=True)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    assert isinstance(par.scale, DTensor)
    x, shift = torch.randn(4, 6), torch.randn(6)
    loss, aux = par(x, shift=shift)
    rloss, raux = ref(x, shift=shift)
    assert torch.equal(loss, rloss.detach()) and torch.equal(aux, raux)
    loss.backward()  # the second output's tangent arrives as None -> zeros
    rloss.backward()
    for (n, p), q in zip(par.named_parameters(), ref.parameters()):
        assert torch.allclose(p.grad.full_tensor(), q.grad, rtol=1e-6, atol=1e-7), n


def test_input_gradients_reach_local_inputs(mesh1):
    torch.manual_seed(0)
    ref = WithBuffer()
    with torch.device("meta"):
        meta = WithBuffer()
    x0 = torch.randn(4, 6)
    step = trace_training_step(
        meta,
        lambda: ForwardInputs(
            args=(torch.empty(4, 6).requires_grad_(),), kwargs={"shift": torch.empty(6)}
        ),
    )
    par = build_parallel_module(meta, step, {"nodes": {}}, mesh1)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    x = x0.clone().requires_grad_()
    rx = x0.clone().requires_grad_()
    shift = torch.randn(6)
    par(x, shift=shift)[0].backward()
    ref(rx, shift=shift)[0].backward()
    assert torch.allclose(x.grad, rx.grad, rtol=1e-6, atol=1e-7)


def test_recorded_plan_replays_strictly_and_strict_catches_wrong_plans(mesh1):
    torch.manual_seed(0)
    ref = WithBuffer()
    with torch.device("meta"):
        meta = WithBuffer()
    step = _trace(meta)
    par = build_parallel_module(meta, step, {"nodes": {}}, mesh1)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    x, shift = torch.randn(4, 6), torch.randn(6)
    par(x, shift=shift)[0].backward()
    plan = runtime_of(par).runner.recorded_plan()
    ops = [
        n.name
        for n in step.gm.graph.nodes
        if n.op == "call_function" and n.target is not __import__("operator").getitem
    ]
    assert set(ops) <= set(plan["nodes"])
    strict = build_parallel_module(meta, step, plan, mesh1, strict=True)
    strict.to_empty(device="cpu")
    load_full_state_dict(strict, ref.state_dict())
    strict(x, shift=shift)[0].backward()
    # a plan that asks for a Partial where DTensor computes a replicated tanh must be refused
    tanh = next(n for n in ops if n.startswith("tanh"))
    bad = {"nodes": dict(plan["nodes"])}
    bad["nodes"][tanh] = {"inputs": plan["nodes"][tanh]["inputs"], "outputs": [["P(sum)"]]}
    wrong = build_parallel_module(meta, step, bad, mesh1, strict=True)
    # the program is lowered as soon as the state is materialised (to_empty), so that is
    # where the plan is found wrong; at the latest the first call would be
    with pytest.raises(
        PlanMismatchError,
        match=r"node tanh.*produced output 0 as \['R'\] " r"but the plan says \['P\(sum\)'\]",
    ):
        wrong.to_empty(device="cpu")
        load_full_state_dict(wrong, ref.state_dict())
        wrong(x, shift=shift)


def test_gpt2_tensor_constants_are_planned_and_fed(mesh1):
    """transformers' GPT-2 builds `torch.tensor([])` constants in forward (get_attr nodes):
    they are exported like buffers, planned, fed by the runtime, and the step matches."""
    transformers = pytest.importorskip("transformers")
    import json

    from autoshard import _core
    from autoshard.planning.graph_export import graph_json

    cfg = transformers.GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    assert cfg.tie_word_embeddings  # GPT-2's default: one weight for input and output

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.GPT2LMHeadModel(cfg)

        def forward(self, ids):
            return self.m(input_ids=ids, labels=ids).loss

    torch.manual_seed(0)
    ref = LM().eval()  # no dropout, so the two runs are comparable
    with torch.device("meta"):
        meta = LM().eval()
    step = trace_training_step(meta, lambda: torch.randint(0, 64, (2, 8)), capture="direct")
    consts = [n.name for n in step.gm.graph.find_nodes(op="get_attr")]
    assert consts, "expected GPT-2 to trace tensor constants"
    graph = json.loads(graph_json(step))
    exported = {n["name"]: n for n in graph["nodes"]}
    assert all(exported[c]["role"] == "buffer" for c in consts)
    plan = json.loads(
        _core.plan_graph(
            graph_json(step),
            json.dumps({"mesh": {"shape": [1], "dim_names": ["dp"]}, "time_limit_s": 2}),
        )
    )
    par = build_parallel_module(meta, step, plan, mesh1, strict=True)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    ids = torch.randint(0, 64, (2, 8))
    loss = par(ids)
    rloss = ref(ids)
    torch.testing.assert_close(loss, rloss.detach(), rtol=1e-5, atol=1e-6)
    loss.backward()
    rloss.backward()
    assert par.m.lm_head.weight is par.m.transformer.wte.weight
    for name, p in ref.named_parameters():
        got = dict(par.named_parameters())[name].grad.full_tensor()
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-6)


class TiedProjection(nn.Module):
    """One weight used twice (embedding lookup and output projection), as in tied LMs."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 16, bias=False)
        self.proj.weight = self.emb.weight

    def forward(self, ids):
        return self.proj(torch.tanh(self.emb(ids))).logsumexp(-1).sum()


def test_tied_weight_is_one_parameter_with_the_summed_gradient(mesh1):
    import json

    from autoshard import _core
    from autoshard.planning.graph_export import graph_json

    torch.manual_seed(0)
    ref = TiedProjection()
    with torch.device("meta"):
        meta = TiedProjection()
    step = trace_training_step(meta, lambda: torch.randint(0, 16, (4, 5)))
    # one placeholder and one gradient output for the one tensor
    assert list(step.param_fqns.values()) == ["emb.weight"]
    assert [o.grad_of for o in step.outputs if o.role == "grad"] == list(step.param_fqns)
    plan = json.loads(
        _core.plan_graph(
            graph_json(step),
            json.dumps({"mesh": {"shape": [1], "dim_names": ["dp"]}, "time_limit_s": 2}),
        )
    )
    par = build_parallel_module(meta, step, plan, mesh1, strict=True)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    assert par.proj.weight is par.emb.weight
    ids = torch.randint(0, 16, (4, 5))
    loss, rloss = par(ids), ref(ids)
    torch.testing.assert_close(loss, rloss.detach(), rtol=1e-5, atol=1e-6)
    loss.backward()
    rloss.backward()
    # both uses contribute: the lookup's rows and the projection's full matrix
    torch.testing.assert_close(
        par.emb.weight.grad.full_tensor(), ref.emb.weight.grad, rtol=1e-5, atol=1e-6
    )


class FlattenAfterTranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(4, 4)

    def forward(self, x):
        return self.w(x).transpose(1, 2).contiguous().flatten(-2).sum()


@pytest.mark.parametrize("runtime", ["interpret", "program"])
def test_recorded_view_of_a_tensor_not_contiguous_at_run_time_reshapes(mesh1, runtime):
    # the trace may record `view` where its input was contiguous (an attention kernel's
    # output strides); at run time the local tensor may not be: the runner reshapes
    with torch.device("meta"):
        meta = FlattenAfterTranspose()
    step = trace_training_step(meta, lambda: torch.empty(2, 3, 4), capture="direct")
    for n in list(step.gm.graph.nodes):  # drop the copy: the view now sees a transpose
        if n.target == torch.ops.aten.clone.default:
            n.replace_all_uses_with(n.args[0])
            step.gm.graph.erase_node(n)
    step.gm.recompile()
    par = build_parallel_module(meta, step, {"nodes": {}}, mesh1, runtime=runtime)
    par.to_empty(device="cpu")
    ref = FlattenAfterTranspose()
    load_full_state_dict(par, ref.state_dict())
    x = torch.randn(2, 3, 4)
    assert torch.allclose(par(x), ref(x).detach())


class SeqNet(nn.Module):
    """Batch and sequence sizes both free: [b, s, d] -> per-token MLP, a mean over the
    sequence; a dropout of rate 0 (a mode-dependent op, values comparable in training)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.0)
        self.out = nn.Linear(16, 8)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(self.drop(h)).mean(1)


def _dynamic_module(mesh, dynamic=True):
    from torch.distributed.tensor import Shard

    from autoshard import AutoParallel

    with torch.device("meta"):
        meta = SeqNet()
    with AutoParallel(
        meta,
        lambda: (torch.empty(4, 6, 8),),
        mesh,
        hardware="CPU",
        capture="direct",
        dynamic=dynamic,
        plan_cache=False,
    ) as autop:
        autop.add_input_constraints([(Shard(0),)])
        autop.add_output_constraints([(Shard(0),)])
        par = autop.apply_placement(autop.optimize_placement())
    par.to_empty(device="cpu")
    return par


def test_dynamic_true_runs_new_input_shapes_like_single_device(mesh1):
    """dynamic=True: calls with other batch / sequence sizes get their own step (traced,
    planned with the parameters pinned, lowered) on first use, cached per shape and mode;
    values and gradients are the single-device model's; the parameters are the same
    tensors throughout."""
    torch.manual_seed(0)
    ref = SeqNet()
    par = _dynamic_module(mesh1)
    load_full_state_dict(par, ref.state_dict())
    params = {n: p for n, p in par.named_parameters()}
    for shape in [(4, 6, 8), (2, 6, 8), (4, 3, 8), (7, 11, 8), (2, 6, 8)]:
        x = torch.randn(shape)
        par.eval()
        ref.eval()
        torch.testing.assert_close(par(x), ref(x))  # eval, autograd on
        with torch.no_grad():
            torch.testing.assert_close(par(x), ref(x))
        par.train()
        ref.train()
        out, want = par(x), ref(x)
        torch.testing.assert_close(out, want)
        out.square().sum().backward()
        want.square().sum().backward()
        for n, q in ref.named_parameters():
            torch.testing.assert_close(params[n].grad.full_tensor(), q.grad, msg=n)
        par.zero_grad()
        ref.zero_grad()
    assert dict(par.named_parameters()) == params  # never replaced or re-laid out
    shaped = [k for k in runtime_of(par).variants if len(k) == 3]
    # three new shapes, each as an eval step, an eval forward and a training step
    assert len(shaped) == 9 and {k[2] for k in shaped} == {
        ((2, 6, 8),),
        ((4, 3, 8),),
        ((7, 11, 8),),
    }
    with pytest.raises(ValueError, match="traced with 3.*number of dims"):
        par(torch.randn(4, 8))
    with pytest.raises(ValueError, match="dtype"):
        par(torch.randn(4, 6, 8, dtype=torch.float64))


def test_without_dynamic_another_input_shape_is_an_error(mesh1):
    par = _dynamic_module(mesh1, dynamic=False)
    with pytest.raises(ValueError, match=r"input 0 \(x\) has shape \[2, 6, 8\].*dynamic=True"):
        par(torch.randn(2, 6, 8))
    assert runtime_of(par).variants == {}
