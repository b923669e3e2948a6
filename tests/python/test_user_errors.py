"""Nothing silently wrong (issue 11), on a one-rank gloo mesh in this process: every misuse
gives the single-device result or an error naming the cause and the fix. Keyword inputs in
any order, eval / no_grad, double backward, torch's load_state_dict, to_empty without
initialisation, and models one static graph cannot hold."""

import warnings

import pytest
import torch
import torch.nn as nn

from autoshard import AutoParallel, _core
from autoshard.runtime.module_state import load_full_state_dict
from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.trace.tracer import UnsupportedModelError, trace_training_step

needs_planner = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


class Regression(nn.Module):
    """forward(x, target): the item-1 shape, with dropout for the eval tests."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(p)

    def forward(self, x, target):
        return ((self.drop(self.lin(x)) - target) ** 2).mean()


class DictInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, batch, scale=1.0):
        return ((self.lin(batch["x"]) * scale - batch["target"]) ** 2).mean()


def _parallel(mesh, cls, *args, example=None, runtime="program", planner=False):
    """(reference, parallel module with the same weights), on the one-rank mesh."""
    torch.manual_seed(0)
    ref = cls(*args)
    with torch.device("meta"):
        meta = cls(*args)
    example = example or (lambda: (torch.empty(4, 6), torch.empty(4, 6)))
    if planner:
        with AutoParallel(meta, example, mesh, time_limit_s=2.0, runtime=runtime) as autop:
            par = autop.apply_placement(autop.optimize_placement())
    else:
        par = build_parallel_module(
            meta,
            trace_training_step(meta, example, capture="direct"),
            {"nodes": {}},
            mesh,
            runtime=runtime,
        )
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    return ref, par


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 6, generator=g), 3 * torch.randn(4, 6, generator=g)


# ---- item 1: inputs bound by name ------------------------------------------------------------
def test_keyword_order_and_mixes_bind_by_name(mesh1):
    ref, par = _parallel(mesh1, Regression)
    x, t = _data()
    want = ref(x, t).item()
    assert par(target=t, x=x).item() == want  # was the loss of (x=t, target=x)
    assert par(x, target=t).item() == want
    assert par(x=x, target=t).item() == want


def test_dict_argument_flattens_by_key(mesh1):
    example = lambda: ({"x": torch.empty(4, 6), "target": torch.empty(4, 6)},)
    ref, par = _parallel(mesh1, DictInput, example=example)
    x, t = _data()
    want = ref({"x": x, "target": t}).item()
    assert par({"target": t, "x": x}).item() == want
    assert par(batch={"target": t, "x": x}).item() == want
    with pytest.raises(
        ValueError,
        match=r"argument 'batch' does not have the structure it "
        r"was traced with \(a dict with keys \['x', 'target'\]",
    ):
        par({"x": x, "y": t})
    with pytest.raises(
        TypeError, match=r"argument\(s\) scale were not given when the model " r"was traced"
    ):
        par({"x": x, "target": t}, scale=2.0)
    assert par({"x": x, "target": t}, scale=1.0).item() == want  # the traced default
    with pytest.raises(TypeError, match="missing a required argument: 'batch'"):
        par()


def test_input_errors_name_the_argument(mesh1):
    ref, par = _parallel(mesh1, Regression)
    x, t = _data()
    with pytest.raises(ValueError, match=r"input 1 \(target\) has dtype torch.float64"):
        par(x, target=t.double())


# ---- item 2: eval and no_grad run an inference step ------------------------------------------
@needs_planner
@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_eval_mode_runs_the_eval_forward(mesh1, runtime):
    ref, par = _parallel(mesh1, Regression, 0.5, runtime=runtime, planner=True)
    x, t = _data()
    ref.eval()
    want = ref(x, t)
    par.eval()
    out = par(x, t)
    assert torch.equal(out.detach(), want.detach())  # dropout off, exactly the eval output
    out.backward()  # eval with autograd on: an eval-mode training step, gradients like torch
    want.backward()
    torch.testing.assert_close(par.lin.weight.grad.full_tensor(), ref.lin.weight.grad)
    with torch.no_grad():
        quiet = par(x, t)
    assert torch.equal(quiet, want.detach()) and quiet.grad_fn is None
    with torch.inference_mode():
        assert torch.equal(par(x, t), want.detach())
    # back to training: the training step again (dropout on, autograd graph)
    par.train()
    trained = par(x, t)
    assert trained.grad_fn is not None and not torch.equal(trained.detach(), want.detach())
    # the parameters never moved: every mode's step read them in the training layouts
    assert [type(p).__name__ for p in par.parameters()] == ["DTensor", "DTensor"]


def test_no_grad_in_training_mode_builds_no_graph(mesh1):
    ref, par = _parallel(mesh1, Regression)
    x, t = _data()
    with torch.no_grad():
        out = par(x, t)
    assert out.grad_fn is None and torch.equal(out, ref(x, t).detach())


# ---- item 8c: to_empty without initialisation ------------------------------------------------
def test_uninitialised_parameters_warn_once(mesh1):
    with torch.device("meta"):
        meta = Regression()
    step = trace_training_step(
        meta, lambda: (torch.empty(4, 6), torch.empty(4, 6)), capture="direct"
    )
    par = build_parallel_module(meta, step, {"nodes": {}}, mesh1)
    par.to_empty(device="cpu")
    x, t = _data()
    with pytest.warns(
        UserWarning,
        match=r"lin.weight, lin.bias were materialised by " r"to_empty\(\) and never written since",
    ):
        par(x, t)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="autoshard")
        par(x, t)  # once
        for init in (
            lambda m: m.lin.reset_parameters(),
            lambda m: m.load_state_dict(Regression().state_dict()),
        ):
            par.to_empty(device="cpu")
            init(par)
            par(x, t)  # written since to_empty: no warning


# ---- item 9 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_second_backward_is_torchs_error_and_retain_graph_works(mesh1, runtime):
    ref, par = _parallel(mesh1, Regression, runtime=runtime)
    x, t = _data()
    loss = par(x, t)
    loss.backward(retain_graph=True)
    once = par.lin.weight.grad.full_tensor().clone()
    loss.backward()
    torch.testing.assert_close(par.lin.weight.grad.full_tensor(), 2 * once)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_torch_load_state_dict_takes_full_tensors(mesh1):
    ref, par = _parallel(mesh1, Regression)
    torch.manual_seed(5)
    other = Regression()
    par.load_state_dict(other.state_dict())  # full tensors: sliced into each layout
    for name, p in par.state_dict().items():
        assert torch.equal(p.full_tensor(), other.state_dict()[name]), name
    with pytest.raises(RuntimeError, match="size mismatch for lin.weight"):
        par.load_state_dict({**other.state_dict(), "lin.weight": torch.zeros(3, 6)})


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:
            h = 2 * h
        return h.mean()


class WithBatchNorm(nn.Module):
    def __init__(self, **bn):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6, **bn)

    def forward(self, x):
        return self.bn(self.lin(x)).pow(2).mean()


@pytest.mark.parametrize("capture", ["dynamo", "direct"])
def test_data_dependent_branch_names_the_line_and_workaround(capture):
    with torch.device("meta"):
        model = DataDependent()
    with pytest.raises(
        UnsupportedModelError,
        match=r"reads a tensor's VALUE while tracing at "
        r"test_user_errors.py:\d+: `if h.sum\(\) > "
        r"0:`.*torch.where",
    ):
        trace_training_step(model, lambda: torch.empty(4, 6), capture=capture)


def test_batchnorm_in_training_traces_with_its_running_stats_written():
    step = trace_training_step(WithBatchNorm().to("meta"), lambda: torch.empty(4, 6))
    written = {step.buffer_fqns[o.grad_of] for o in step.outputs if o.role == "mutation"}
    assert written == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    ops = {str(n.target) for n in step.gm.graph.nodes if n.op == "call_function"}
    assert not any("batch_norm" in op for op in ops)  # decomposed: every op has a rule


def test_binder_handles_var_arguments_and_names_tuple_mismatches():
    import inspect

    import torch.utils._pytree as pytree

    from autoshard.trace.input_binding import InputBinder

    def forward(x, *rest, scale=1.0, **extra):
        pass

    traced = ((1, (2, 3)), {"scale": 4, "mask": 5})  # leaves numbered as the trace did
    leaves, spec = pytree.tree_flatten(traced)
    binder = InputBinder(inspect.signature(forward), spec, len(leaves))
    assert binder.labels() == ["x", "rest[0][0]", "rest[0][1]", "scale", "extra['mask']"]
    assert binder.flatten((1, (2, 3)), {"mask": 5, "scale": 4}) == [1, 2, 3, 4, 5]
    with pytest.raises(TypeError, match=r"missing argument 'rest\[0\]'"):
        binder.flatten((1,), {"mask": 5, "scale": 4})
    with pytest.raises(
        ValueError,
        match=r"argument 'rest\[0\]' does not have the structure "
        r"it was traced with \(a tuple of 2\)",
    ):
        binder.flatten((1, (2, 3, 4)), {"mask": 5, "scale": 4})
    with pytest.raises(
        TypeError, match=r"extra\['other'\] were not given when the model " r"was traced"
    ):
        binder.flatten((1, (2, 3)), {"mask": 5, "scale": 4, "other": 6})


# ---- item 7: requests without a plan name the conflicting constraints -------------------------
class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x, target):
        return ((self.lin(x) - target) ** 2).mean()


def _virtual_mesh4():
    """A 4-rank mesh to plan on (nothing runs on it), next to the one-rank process group."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.arange(4), _init_backend=False)


@needs_planner
@pytest.mark.parametrize("conflict", ["input", "parameter_memory"])
def test_infeasible_request_names_the_conflicting_constraints(mesh1, conflict):
    import re

    from torch.distributed.tensor import Replicate

    with torch.device("meta"):
        model = Wide()
    example = lambda: (torch.empty(1024, 64), torch.empty(1024, 64))
    # x [1024, 64] float32 is 256 KiB unsharded, 64 KiB on each of 4 ranks: the limit holds
    # only with x sharded, and only with the parameters sharded.
    with AutoParallel(
        model, example, _virtual_mesh4(), time_limit_s=1.0, memory_limit_bytes=270_000
    ) as autop:
        if conflict == "input":
            autop.add_input_constraints([(Replicate(),), None])
        else:
            autop.add_parameter_memory_constraint(low=1.0, high=1.0)  # DDP-like: replicated
        with pytest.raises(ValueError) as info:
            autop.optimize_placement()
    msg = str(info.value)
    assert msg.startswith("autoshard planner: no feasible plan:"), msg
    assert (
        "\nCause (proven: with every other constraint removed there is still no plan, and "
        "removing any one of these gives a plan"
    ) in msg, msg
    assert "these 2 constraints cannot all hold:" in msg, msg
    assert "\n  - memory limit = 270000 bytes per GPU (memory_limit_bytes" in msg, msg
    if conflict == "input":
        assert re.search(
            r"\n  - input constraint on '\w+' = \(Replicate\(\),\) \[\"R\"\]: "
            r"forward input 0, placeholder float32\[1024,64\]",
            msg,
        ), msg
        assert re.search(
            r"\nFix: remove or relax the input constraint on '\w+' or the memory "
            r"limit: the request without any one of them has a plan\.",
            msg,
        ), msg
    else:
        assert "\n  - parameter memory low bound = 1 (" in msg, msg
        assert (
            "\nFix: remove or relax the parameter memory low bound or the memory limit" in msg
        ), msg
