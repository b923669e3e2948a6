"""The AutoParallel-compatible API in one process, on a fake process group (no GPU, no
real collectives): errors, input validation, planner hookup, the demo."""

import logging

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard

from autoshard import AutoParallel, _core
from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.trace.fake_pg import fake_world
from autoshard.models import MLP
from autoshard.trace.tracer import trace_training_step
from autoshard.runtime.module_runtime import runtime_of

needs_planner = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


@pytest.fixture
def mesh4():
    with fake_world((4,), device_type="cpu") as mesh:
        yield mesh


def _mlp():
    with torch.device("meta"):
        return MLP(16, 32, 2)


def _inputs():
    return torch.empty(8, 16), torch.empty(8, 16)


def test_methods_outside_with_raise(mesh4):
    autop = AutoParallel(_mlp(), _inputs, mesh4)
    with pytest.raises(RuntimeError, match="context manager"):
        autop.add_parameter_memory_constraint()
    with autop:
        autop.add_parameter_memory_constraint(0.0, 0.5)
    with pytest.raises(RuntimeError, match="not reentrant"):
        autop.optimize_placement()
    with pytest.raises(RuntimeError, match="not reentrant"):
        with autop:
            pass


def test_constraint_errors_name_the_problem(mesh4):
    with AutoParallel(_mlp(), _inputs, mesh4) as autop:
        with pytest.raises(ValueError, match="got 1 entries, the model has 2 inputs"):
            autop.add_input_constraints([(Shard(0),)])
        with pytest.raises(ValueError, match="expected 1 placements"):
            autop.add_input_constraints([(Shard(0), Replicate()), None])
        with pytest.raises(ValueError, match="low <= high"):
            autop.add_parameter_memory_constraint(0.5, 0.25)
        autop.add_input_constraints([(Shard(0),), (Shard(-2),)])
        opts = autop.options()
        assert list(opts.input_constraints.values()) == [["S(0)"], ["S(0)"]]
        # the planner's default budget (low 0, high 1/mesh size): left out of the JSON
        assert opts.parameter_memory == "default" and "parameter_memory" not in opts.to_json()
        autop.remove_parameter_memory_constraint()
        assert autop.options().parameter_memory is None


def test_parameter_budget_below_one_shard_is_refused(mesh4):
    with AutoParallel(_mlp(), _inputs, mesh4) as autop:
        with pytest.raises(
            ValueError,
            match=r"high=0.1 is below 1/mesh.size\(\) = 1/4 = 0.25, "
            r"the least any plan can store per GPU",
        ):
            autop.add_parameter_memory_constraint(high=0.1)
        with pytest.raises(ValueError, match="low <= high <= 1"):
            autop.add_parameter_memory_constraint(low=-0.5)
        autop.add_parameter_memory_constraint(high=0.25)  # exactly one shard per rank: fine


@needs_planner
def test_planner_errors_reach_the_user_as_value_errors(mesh4, monkeypatch):
    def refuse(graph, options):  # what the C++ binding raises for an infeasible budget
        raise RuntimeError("parameter memory budget high=0.1 cannot be met: ...")

    with AutoParallel(_mlp(), _inputs, mesh4, time_limit_s=1.0) as autop:
        monkeypatch.setattr(_core, "plan_graph", refuse)
        with pytest.raises(
            ValueError, match=r"^autoshard planner: parameter memory budget"
        ) as info:
            autop.optimize_placement()
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_rank_timeout_must_be_positive(mesh4):
    with pytest.raises(ValueError, match="rank_timeout_s must be a positive"):
        AutoParallel(_mlp(), _inputs, mesh4, rank_timeout_s=0)


def test_unknown_mixed_precision_policy_is_refused_clearly(mesh4):
    with pytest.raises(TypeError, match="MixedPrecisionPolicy"):
        AutoParallel(_mlp(), _inputs, mesh4, mp_policy=object())
    with pytest.raises(ValueError, match="param_dtype must be a floating"):
        AutoParallel(
            _mlp(), _inputs, mesh4, mp_policy=MixedPrecisionPolicy(param_dtype=torch.int32)
        )


def test_runtime_input_validation_names_argument_and_local_shape(mesh4):
    model = _mlp()
    step = trace_training_step(model, _inputs)
    plan = {"nodes": {name: {"outputs": [["S(0)"]]} for name in step.input_nodes}}
    par = build_parallel_module(model, step, plan, mesh4)
    assert isinstance(par, MLP)
    assert list(par.state_dict()) == list(MLP(16, 32, 2).state_dict())
    par.to_empty(device="cpu")
    with pytest.raises(TypeError, match=r"missing a required argument: 'target'"):
        par(torch.zeros(2, 16))
    with pytest.raises(
        ValueError,
        match=r"input 0 \(x\) has shape \[8, 16\] but this rank "
        r"expects the local shape \[2, 16\] \(global "
        r"\[8, 16\]",
    ):
        par(torch.zeros(8, 16), torch.zeros(2, 16))
    with pytest.raises(ValueError, match=r"input 1 \(target\) has dtype torch.float64"):
        par(torch.zeros(2, 16), torch.zeros(2, 16, dtype=torch.float64))


def test_meta_parameters_must_be_materialised(mesh4):
    model = _mlp()
    step = trace_training_step(model, _inputs)
    par = build_parallel_module(model, step, {"nodes": {}}, mesh4)
    with pytest.raises(RuntimeError, match="to_empty"):
        par(torch.zeros(8, 16), torch.zeros(8, 16))


class Bessel(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(8, 8)

    def forward(self, x):
        return torch.special.bessel_j0(self.w(x)).sum()


@needs_planner
def test_op_without_rule_names_op_and_source_line(mesh4):
    with torch.device("meta"):
        model = Bessel()
    with AutoParallel(model, lambda: torch.empty(4, 8), mesh4, time_limit_s=2.0) as autop:
        with pytest.raises(ValueError) as info:
            autop.optimize_placement()
    msg = str(info.value)
    print(msg)
    assert "special_bessel_j0" in msg
    assert "test_api.py" in msg and "bessel_j0(self.w(x))" in msg


@needs_planner
def test_verbose_plan_logs_nodes_and_totals(mesh4, caplog):
    with AutoParallel(_mlp(), _inputs, mesh4, time_limit_s=2.0) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        with caplog.at_level(logging.INFO, logger="autoshard"):
            plan = autop.optimize_placement(verbose=True)
    text = caplog.text
    print(text)
    assert "strategies=" in text and "compute=" in text and "comm=" in text
    assert "total" in text and "parameters" in text
    names = {n.name for n in autop.step.gm.graph.nodes if n.op != "output"}
    assert set(plan["nodes"]) <= names


@needs_planner
def test_demo_plans_a_small_llama_quickly(capsys):
    from autoshard.tools.demo import main

    rc = main(
        [
            "--layers",
            "1",
            "--mesh",
            "2x2",
            "--seq",
            "64",
            "--batch-per-dp",
            "2",
            "--time-limit",
            "10",
        ]
    )
    out = capsys.readouterr().out
    print(out)
    assert rc == 0
    assert "layers.0:" in out and "layers.0.attention.wq.weight" in out
    assert "parameter memory per GPU" in out and "communication" in out


def test_cpu_profile_scales_compute_when_ranks_share_cores(monkeypatch):
    """4 ranks on 2 cores: each rank gets half a core, so the default CPU profile's compute
    figures are halved (communication figures stay: they were measured so)."""
    import os

    from autoshard.planning.planner import cpu_profile_for_host

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cpu_profile_for_host() == "CPU"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    prof = cpu_profile_for_host()
    base = _core.hardware_profile("CPU")
    assert prof["base"] == "CPU" and "4 ranks on 2 cores" in prof["name"]
    assert prof["peak_flops_fp32"] == base["peak_flops_fp32"] / 2
    assert prof["hbm_bandwidth"] == base["hbm_bandwidth"] / 2
    assert "intra_node_bandwidth" not in prof


class _DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


@needs_planner
def test_compiled_module_plans_no_grad_and_eval_steps_on_first_use():
    """torch.compile(parallel, fullgraph=True) called first without autograd, or in eval
    mode: the step of that mode is traced, planned and lowered while Dynamo traces the call
    (modes._prepare_variant, outside the graph), it computes what the single-device model
    does, and calls in every mode afterwards run without compiling again."""
    torch.manual_seed(0)
    reference = _DropoutNet()
    with fake_world((1,), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = _DropoutNet()
        with AutoParallel(
            model,
            lambda: (torch.empty(8, 16),),
            mesh,
            hardware="CPU",
            capture="direct",
            plan_cache=False,
        ) as autop:
            autop.add_input_constraints([(Shard(0),)])
            autop.add_output_constraints([(Shard(0),)])
            par = autop.apply_placement(autop.optimize_placement())
        par.to_empty(device="cpu")
        par.load_state_dict(reference.state_dict())
        torch._dynamo.reset()
        compiled = torch.compile(par, fullgraph=True)
        x = torch.randn(8, 16)
        reference.eval()
        want = reference(x)
        with torch.no_grad():  # the first call ever: a mode the planned step is not
            par.eval()
            torch.testing.assert_close(compiled(x), want)
            par.train()
            out = compiled(x)  # training mode, no autograd: dropout on, no graph
            assert out.shape == (8, 16) and not out.requires_grad
        par.eval()
        torch.testing.assert_close(compiled(x), want)  # eval mode with autograd
        par.train()
        compiled(x).sum().backward()  # the planned training step
        assert set(runtime_of(par).variants) == {
            ((False,) * 4, False),
            ((True,) * 4, False),
            ((False,) * 4, True),
        }
        torch._dynamo.config.error_on_recompile = True
        try:
            for _ in range(2):
                compiled(x)
                with torch.no_grad():
                    compiled(x)
        finally:
            torch._dynamo.config.error_on_recompile = False
        torch._dynamo.reset()


@needs_planner
def test_dynamic_new_local_shapes_are_planned_at_their_global_shapes():
    """On 2 ranks with the batch sharded, a call with a local batch of 3 is the step of a
    global batch of 6; the new step's plan keeps every parameter's layout. (The fake process
    group's collectives do nothing: shapes are checked, not values.)"""
    with fake_world((2,), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        with AutoParallel(
            model,
            lambda: (torch.empty(8, 16),),
            mesh,
            hardware="CPU",
            capture="direct",
            dynamic=True,
            plan_cache=False,
        ) as autop:
            autop.add_input_constraints([(Shard(0),)])
            autop.add_output_constraints([(Shard(0),)])
            par = autop.apply_placement(autop.optimize_placement())
        par.to_empty(device="cpu")
        with torch.no_grad():
            out = par(torch.randn(3, 16))
        assert out.shape[0] == 3
        ((key, variant),) = runtime_of(par).variants.items()
        assert key[2] == ((3, 16),)
        runner = variant.runner
        (x,) = [n for n in runner.step.input_nodes if n is not None]
        assert runner.global_shape(x) == (6, 16)
        for ph, fqn in runner.step.param_fqns.items():
            assert tuple(runner.placeholder_layout(ph)) == tuple(par.get_parameter(fqn).placements)
