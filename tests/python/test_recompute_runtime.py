"""Recomputation in the runtime (trace/step_schedule.py ``with_recompute``): the plan's
``recompute`` list makes the backward run those forward nodes again instead of keeping
their values. Gradients stay equal to the single-device model's (dropout included: its mask
is kept, never drawn again); the program keeps fewer bytes between the passes; early nodes
in the list (a weight's transpose) run in the backward only."""

import pytest
import torch
import torch.nn as nn

from autoshard._testing.models_zoo import llama3_small
from autoshard.runtime.memory_probe import measure_step_memory
from autoshard.runtime.module_runtime import runtime_of
from autoshard.runtime.module_state import load_full_state_dict
from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.trace.step_schedule import BACKWARD, FORWARD, recomputable
from autoshard.trace.tracer import trace_training_step


def _llama():
    return llama3_small()


class Dropped(nn.Module):
    """Dropout between two linears: its mask must be the same in the recomputed region."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x)))).pow(2).mean()


def _every_forward_node(step) -> list[str]:
    s = step.schedule
    return [
        n.name
        for n in step.gm.graph.nodes
        if n.op == "call_function" and s.runs_in[n.name] == FORWARD and recomputable(n)
    ]


def _run(model_fn, inputs, recompute_of, mesh, runtime="program", seed=0, compile=False):
    torch.manual_seed(0)
    ref = model_fn()
    with torch.device("meta"):
        meta = model_fn()
    step = trace_training_step(meta, lambda: inputs)
    plan = {"nodes": {}, "recompute": recompute_of(step)}
    par = build_parallel_module(meta, step, plan, mesh, runtime=runtime, compile=compile)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    torch.manual_seed(seed)
    par(*inputs).backward()
    grads = {n: p.grad.full_tensor() for n, p in par.named_parameters()}
    for p in par.parameters():
        p.grad = None
    torch.manual_seed(seed)
    if compile:  # torch's memory tracker is a dispatch mode, which compiled code refuses
        return step, grads, _saved_bytes_of_a_step(par, inputs)
    measured = measure_step_memory(par, lambda: par(*inputs).backward(), inputs)
    return step, grads, measured


def _saved_bytes_of_a_step(par, inputs) -> int:
    """The bytes the program kept between its passes over one step (its own count)."""
    state = runtime_of(par).main.run_state
    state.count_saved = True
    try:
        par(*inputs).backward()
    finally:
        state.count_saved = False
    return state.saved_bytes


@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_recomputing_every_forward_node_keeps_the_gradients(mesh1, runtime):
    torch.manual_seed(1)
    inputs = (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    _, kept, kept_mem = _run(_llama, inputs, lambda s: [], mesh1, runtime)
    step, again, again_mem = _run(_llama, inputs, _every_forward_node, mesh1, runtime)
    for name, g in kept.items():
        torch.testing.assert_close(again[name], g, rtol=1e-5, atol=1e-6, msg=name)
    if runtime == "program":
        assert again_mem.saved_bytes < 0.5 * kept_mem.saved_bytes


def test_dropout_is_kept_and_the_rest_recomputed(mesh1):
    x = torch.randn(4, 8)
    _, kept, _ = _run(Dropped, (x,), lambda s: [], mesh1, seed=3)
    step, again, _ = _run(Dropped, (x,), _every_forward_node, mesh1, seed=3)
    for name, g in kept.items():
        torch.testing.assert_close(again[name], g, rtol=1e-6, atol=1e-7, msg=name)
    s = step.schedule.with_recompute(step.gm, _every_forward_node(step))
    random_nodes = [
        n.name
        for n in step.gm.graph.nodes
        if n.op == "call_function"
        and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
    ]
    assert random_nodes and not set(random_nodes) & s.recompute


def test_a_compiled_program_recomputes_and_keeps_the_random_masks(mesh1):
    """compile=True (inductor) runs the recomputing backward: gradients equal the compiled
    program that keeps everything, dropout's mask included (inductor draws its own random
    numbers, so both sides are compiled), and fewer bytes cross the passes."""
    x = torch.randn(4, 8)
    _, kept, kept_mem = _run(Dropped, (x,), lambda s: [], mesh1, seed=3, compile=True)
    _, again, again_mem = _run(Dropped, (x,), _every_forward_node, mesh1, seed=3, compile=True)
    for name, g in kept.items():
        torch.testing.assert_close(again[name], g, rtol=1e-6, atol=1e-7, msg=name)
    assert 0 < again_mem < kept_mem


def test_early_nodes_recomputed_run_in_the_backward_and_bad_names_are_refused():
    with torch.device("meta"):
        meta = _llama()
    inputs = (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    step = trace_training_step(meta, lambda: inputs)
    base = step.schedule
    early = sorted(base.early)
    s = base.with_recompute(step.gm, early)
    assert not s.early and all(s.runs_in[n] == BACKWARD for n in early)
    assert not s.recompute
    # the transposes' inputs (the weights) are kept instead of their outputs
    assert not set(early) & s.saved
    order = [n.name for n in s.backward_order(step.gm)]
    assert set(early) <= set(order)
    for bad, why in (
        ("no_such_node", "not a node"),
        (sorted(base.saved - set(base.phase))[0], "not a node"),
    ):
        with pytest.raises(ValueError, match=why):
            base.with_recompute(step.gm, [bad])
    backward_node = next(n for n, p in base.runs_in.items() if p == BACKWARD)
    with pytest.raises(ValueError, match="does not run"):
        base.with_recompute(step.gm, [backward_node])


def test_the_plan_summary_and_options_carry_recomputation():
    from autoshard.planning.options import PlannerOptions
    from autoshard.planning.plan import Plan

    opts = PlannerOptions(mesh_shape=[4], recompute="selective")
    assert PlannerOptions.from_json(opts.to_json()).recompute == "selective"
    plan = Plan.from_json(
        {
            "nodes": {},
            "recompute": ["t", "mul"],
            "summary": {
                "recompute": {
                    "added_us": 1500.0,
                    "limit_bytes": 1 << 30,
                    "fits": True,
                    "blocks": {"layers.0": "full", "layers.1": "reshard"},
                }
            },
        }
    )
    assert plan.recompute == ["t", "mul"]
    r = plan.summary.recompute
    assert r.fits and r.limit_bytes == 1 << 30
    assert r.describe() == "recompute: layers.0 full, layers.1 reshard; +1.500 ms a step"
    assert Plan.from_json({"nodes": {}}).summary.recompute.describe() == "recompute: nothing"


@pytest.mark.parametrize("optimizer, state_per_param_byte", [(None, 2), ("sgd", 0)])
def test_the_optimizer_named_on_autoparallel_is_what_the_memory_counts(
    mesh1, optimizer, state_per_param_byte
):
    """AutoParallel(optimizer=...) reaches the planner: Adam (the default) holds two moments
    per parameter byte, SGD none; an unknown name is refused naming the choices."""
    from torch.distributed.tensor import Shard

    from autoshard import AutoParallel

    with torch.device("meta"):
        model = llama3_small()
    tokens = lambda: (torch.zeros(8, 16, dtype=torch.long),) * 2  # noqa: E731
    with AutoParallel(model, tokens, mesh1, optimizer=optimizer, plan_cache=False) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        memory = autop.optimize_placement().plan["summary"]["memory"]
    assert memory["optimizer_state"] == state_per_param_byte * memory["parameters"]
    with pytest.raises(Exception, match="sgd_momentum"):
        with AutoParallel(model, tokens, mesh1, optimizer="lion", plan_cache=False) as autop:
            autop.optimize_placement()
