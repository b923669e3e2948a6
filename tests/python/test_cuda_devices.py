"""What a GPU host changes, emulated on this CPU-only build (cuda_emulation.py: stubs of the
torch.cuda queries, fake CUDA tensors, fake process groups with device_type="cuda").

1. Tracing: a CUDA mesh traces on cuda:0; example inputs made without a device (CPU) must
   reach the model there too, through every public entry point. (The joint trace itself
   stops here at the first autograd node on a fake CUDA tensor, which this build cannot
   create, so the tests stop the trace where it would hand the model to the AOT export,
   after running the fake model once on the converted inputs, without autograd.)
2. Rank devices: the trace names cuda:0 in factory calls (rotary tables, masks); the program
   lowered for rank 1 must name cuda:1 only.
5. Hardware: the GPU's name picks the profile; float32 matmuls are priced as torch runs them
   (TF32 or full float32); hardware="measure" on CUDA says what to use instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
from unittest import mock

import pytest
import torch
import torch.nn as nn
from cuda_emulation import emulated_cuda
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.tensor import Shard

from autoshard import AutoParallel, _core, auto_parallel
from autoshard.planning.planner import default_hardware, measured_hardware, mesh_trace_device
from autoshard.trace.fake_pg import fake_world
from autoshard.planning.hardware import detect_gpu_hardware, fp32_matmul_precision, gpu_part
from autoshard.planning.options import PlannerOptions, enumerate_strategies
from autoshard.program.local_program import check_program_devices, foreign_devices
from autoshard.program.lowering import lower_step
from autoshard.program.interpreter import StepRunner
from autoshard.models import MLP, Llama, LlamaConfig
from autoshard.trace.tracer import _fake_inputs, trace_training_step

needs_planner = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)
CUDA0 = torch.device("cuda", 0)


# ---- 1. tracing on a GPU host ----------------------------------------------------------------
def test_cuda_mesh_traces_on_cuda0_only_where_torch_has_cuda():
    with fake_world((2,), ("dp",), device_type="cuda") as mesh:
        assert mesh_trace_device(mesh) == torch.device("cpu")  # this CPU-only build
        with emulated_cuda():
            assert mesh_trace_device(mesh) == CUDA0


def test_inputs_of_any_device_are_fake_tensors_on_the_trace_device():
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        fake_cpu = torch.empty(4, 3).requires_grad_()
        already = torch.empty(2, device="cuda")
        other_gpu = torch.empty(2, 5, device="cuda:1")
    with FakeTensorMode():
        other_mode = torch.empty(3, device="cuda")
    real = torch.ones(6, 2).t()  # strides kept
    meta = torch.empty(7, dtype=torch.long, device="meta")
    args = (real, fake_cpu, already, other_gpu, other_mode, meta, 3, "x")
    out = _fake_inputs((args, {"mask": torch.ones(2, dtype=torch.bool)}), mode, CUDA0)
    got, kwargs = out
    for t in [*got[:6], kwargs["mask"]]:
        assert isinstance(t, FakeTensor) and t.fake_mode is mode and t.device == CUDA0, t
    assert got[0].stride() == real.stride() and got[1].requires_grad
    assert got[5].dtype == torch.long and got[6:] == (3, "x")
    assert got[2] is already  # already there: kept, with its aliases


class _ReachedExport(Exception):
    """Raised where the trace would hand the fake model to the AOT export."""

    def __init__(self, devices: set):
        super().__init__(f"devices {devices}")
        self.devices = devices


def _devices_then_stop(fake, inputs, fake_mode, *_args, **_kwargs):
    """In place of trace._capture_and_export: the devices of what the export would get (the
    fake model's state and the inputs), then stop. (Running the model on fake CUDA tensors
    stops early on this build: indexing and autograd ask for a CUDA device guard.)"""
    tensors = [*fake.parameters(), *fake.buffers(), *inputs.args, *inputs.kwargs.values()]
    raise _ReachedExport({t.device for t in tensors if isinstance(t, torch.Tensor)})


def _run_then_stop(fake, inputs, fake_mode, *_args, **_kwargs):
    """As _devices_then_stop, after running the fake model once on those inputs without
    autograd: every op's device checks (models whose ops need no device guard)."""
    with fake_mode, torch.no_grad():
        fake(*inputs.args, **inputs.kwargs)
    _devices_then_stop(fake, inputs, fake_mode)


@contextlib.contextmanager
def _stopped_at_export(stop=_devices_then_stop):
    with mock.patch("autoshard.trace.tracer._capture_and_export", stop):
        yield


@pytest.fixture
def cuda_host():
    """A fake 2-rank CUDA mesh on an emulated 8-GPU host, tracing stopped at the export."""
    with emulated_cuda(), fake_world((2,), ("dp",), device_type="cuda") as mesh:
        with _stopped_at_export():
            yield mesh


def _llama():
    with torch.device("meta"):
        return Llama(LlamaConfig(n_layers=2))


def _tokens():  # the README's input_fn: tensors made without a device
    return torch.randint(0, 128, (4, 16)), torch.randint(0, 128, (4, 16))


def _reached_on_cuda0(call) -> None:
    with pytest.raises(_ReachedExport) as e:
        call()
    assert e.value.devices == {CUDA0}


def test_autoparallel_traces_cpu_inputs_on_cuda0(cuda_host):
    _reached_on_cuda0(lambda: AutoParallel(_llama(), _tokens, cuda_host).__enter__())


def test_preset_traces_cpu_inputs_on_cuda0(cuda_host):
    _reached_on_cuda0(lambda: AutoParallel(_llama(), _tokens, cuda_host, preset="fsdp").__enter__())


def test_auto_parallel_traces_real_cpu_samples_on_cuda0(cuda_host):
    with torch.device("meta"):
        model = MLP(16, 32, 2)
    samples = (torch.randn(8, 16), torch.randn(8, 16))
    _reached_on_cuda0(lambda: auto_parallel(model, cuda_host, samples, plan_cache=False))


def test_cpu_inputs_meet_cuda0_weights_without_a_device_error(cuda_host):
    """The failure itself: before the inputs were moved, the first op mixing a CPU input
    with a cuda:0 weight raised "Expected all tensors to be on the same device"."""
    with torch.device("meta"):
        model = MLP(16, 32, 2)
    inputs = lambda: (torch.empty(8, 16), torch.empty(8, 16))  # noqa: E731
    with _stopped_at_export(_run_then_stop):
        _reached_on_cuda0(lambda: AutoParallel(model, inputs, cuda_host).__enter__())


@pytest.mark.parametrize("joint", [True, False], ids=["eval_with_grad", "no_grad"])
def test_mode_variants_trace_their_inputs_on_cuda0(joint):
    """modes.py traces the eval / no-grad / new-shape (dynamic=True) steps on the main
    step's device (cuda:0 on a GPU host) from inputs it makes again, on CPU, from the main
    step's records."""
    from autoshard.runtime.modes import _example_inputs

    with torch.device("meta"):
        model = MLP(16, 32, 2)
    main = trace_training_step(model, lambda: (torch.empty(8, 16), torch.empty(8, 16)))
    with emulated_cuda(), _stopped_at_export():
        for shapes in (None, [(4, 16), (4, 16)]):
            _reached_on_cuda0(
                lambda: trace_training_step(
                    model,
                    _example_inputs(main, joint, shapes),
                    CUDA0,
                    training=False,
                    joint=joint,
                )
            )


def test_demo_traces_on_cuda0(capsys):
    """The demo makes its own fake CUDA mesh, and CPU token tensors."""
    from autoshard.tools.demo import main

    with emulated_cuda(), _stopped_at_export():
        _reached_on_cuda0(lambda: main(["--layers", "2", "--seq", "64", "--trace-only"]))


# ---- 2. each rank's program on its own device ------------------------------------------------
def _cuda0_trace_and_plan():
    """Llama traced and planned for 2 ranks, its device arguments then set to cuda:0, as a
    trace on a GPU host records them (this build cannot trace on CUDA)."""
    with torch.device("meta"):
        model = Llama(LlamaConfig(n_layers=1))
    with fake_world((2,), ("dp",), device_type="cpu") as mesh:
        with AutoParallel(
            model, _tokens, mesh, hardware="H100", capture="direct", plan_cache=False
        ) as autop:
            autop.add_input_constraints([(Shard(0),), (Shard(0),)])
            plan = autop.optimize_placement().plan
            step = autop.step
    factories = []
    for node in step.gm.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": CUDA0}
            factories.append(node.name)
    step.device = CUDA0
    return step, plan, factories


def _fake_local(runner: StepRunner, name: str, mode: FakeTensorMode) -> torch.Tensor:
    val = runner.placeholders[name].meta["val"]
    with mode:
        return torch.empty(runner.expected_local_shape(name), dtype=val.dtype, device=runner.device)


@needs_planner
def test_program_of_rank_1_names_only_cuda1():
    step, plan, factories = _cuda0_trace_and_plan()
    assert factories, "the rotary tables and the mask are made on the input's device"
    with emulated_cuda(current=1), fake_world((2,), ("dp",), device_type="cuda") as mesh:
        runner = StepRunner(step, plan, mesh)  # rank 1's device: the current one
        assert runner.device == torch.device("cuda", 1)
        mode = FakeTensorMode()
        params = [_fake_local(runner, n, mode) for n in runner.param_names]
        inputs = [_fake_local(runner, n, mode) for n in step.input_nodes]
        # before: "found at least two devices, cuda:1 and cuda:0" while lowering
        program = lower_step(runner, params, [], inputs)
    for gm in (program.fwd_gm, program.bwd_gm, program.run_fwd_gm, program.run_bwd_gm):
        assert foreign_devices(gm, torch.device("cuda", 1)) == []
    named = {
        v
        for n in program.fwd_gm.graph.nodes
        for v in n.kwargs.values()
        if isinstance(v, torch.device)
    }
    assert named == {torch.device("cuda", 1)}
    check_program_devices(program, torch.device("cuda", 1))


def test_every_device_argument_becomes_the_ranks():
    runner = StepRunner.__new__(StepRunner)
    runner.device = torch.device("cuda", 3)
    for d in (CUDA0, torch.device("cuda"), torch.device("cpu"), torch.device("cuda", 3)):
        assert runner._fix_device(d) == torch.device("cuda", 3)
    assert runner._fix_device(5) == 5 and runner._fix_device("cuda:0") == "cuda:0"


def _graph_with_arange_on(device: torch.device) -> torch.fx.GraphModule:
    """x + torch.arange(4, device=device), as a traced graph records it."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    arange = g.call_function(torch.ops.aten.arange.default, (4,), {"device": device})
    g.output(g.call_function(torch.ops.aten.add.Tensor, (x, arange)))
    return torch.fx.GraphModule(nn.Module(), g)


def test_device_scan_names_the_node_and_device():
    gm = _graph_with_arange_on(CUDA0)
    assert foreign_devices(gm, torch.device("cuda", 1)) == [
        "arange_default (aten.arange.default) argument: cuda:0"
    ]
    assert foreign_devices(gm, CUDA0) == []
    # the values the nodes hold count too; a CPU scalar does not (it meets any device)
    with FakeTensorMode():
        x, arange = list(gm.graph.nodes)[:2]
        x.meta["val"] = torch.empty(4, device="cuda:2")
        arange.meta["val"] = torch.empty((), device="cpu")
    assert foreign_devices(gm, CUDA0) == ["x value: cuda:2"]


# ---- 5. the hardware profile and the float32 matmul precision -------------------------------
@pytest.mark.parametrize(
    "name, want",
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_gpu_name_picks_its_profile(name, want, caplog):
    with emulated_cuda(name=name), caplog.at_level(logging.INFO, logger="autoshard"):
        assert detect_gpu_hardware() == want
    assert f"GPU {name!r}: planning with the {want} hardware profile" in caplog.text


@pytest.mark.parametrize(
    "name, part, memory",
    [("NVIDIA H100 PCIe", "H100", 80 * 10**9), ("NVIDIA A100-SXM4-40GB", "A100", 40 * 10**9)],
)
def test_other_board_of_a_part_gets_its_profile_with_its_memory(name, part, memory, caplog):
    with emulated_cuda(name=name, total_memory=memory), caplog.at_level(logging.INFO):
        hw = detect_gpu_hardware()
    assert hw == {"base": part, "name": f"{part} ({name})", "memory_bytes": memory}
    assert _core.hardware_profile(json.dumps(hw))["memory_bytes"] == memory
    assert "SXM board's" in caplog.text and "hardware={'base'" in caplog.text


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA GeForce RTX 4090", "NVIDIA GB200"])
def test_unknown_gpu_is_planned_as_h100_with_a_warning(name, caplog):
    assert gpu_part(name) is None  # GH200 is no H200, GB200 no B200
    with emulated_cuda(name=name), caplog.at_level(logging.WARNING):
        assert detect_gpu_hardware() == "H100"
    assert "none of the known parts" in caplog.text and name in caplog.text


def test_cuda_mesh_defaults_to_the_detected_gpu_and_hardware_overrides_it(caplog):
    with emulated_cuda(name="NVIDIA H200"), fake_world((2,), ("dp",), device_type="cuda") as mesh:
        assert default_hardware(mesh) == "H200"
        assert AutoParallel(_llama(), _tokens, mesh).hardware == "H200"
        assert AutoParallel(_llama(), _tokens, mesh, hardware="B200").hardware == "B200"
    with fake_world((2,), ("dp",), device_type="cuda") as mesh, caplog.at_level(logging.INFO):
        assert default_hardware(mesh) == "H100"  # no GPU here: a virtual cluster
    assert "without a GPU: H100 hardware profile" in caplog.text


@pytest.fixture
def tf32_matmuls():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def test_fp32_matmul_precision_follows_torch(tf32_matmuls):
    assert fp32_matmul_precision() == "tf32"


def test_fp32_matmul_precision_default_is_full_float32():
    assert fp32_matmul_precision() == "ieee"


def test_planner_options_carry_the_precision():
    with fake_world((2,), ("dp",), device_type="cuda") as mesh:
        with AutoParallel(_mlp(), _mlp_inputs, mesh, capture="direct") as autop:
            assert autop.options().fp32_matmul_precision == "ieee"
            assert autop.options().to_json()["fp32_matmul_precision"] == "ieee"
            # a profile object that says it itself is the user's word
            autop.hardware = {"base": "H100", "fp32_matmul_uses_tf32": True}
            assert autop.options().fp32_matmul_precision is None
    opts = PlannerOptions(mesh_shape=[2], fp32_matmul_precision="tf32")
    assert PlannerOptions.from_json(opts.to_json()) == opts


def test_planner_options_follow_tf32_when_enabled(tf32_matmuls):
    with fake_world((2,), ("dp",), device_type="cuda") as mesh:
        with AutoParallel(_mlp(), _mlp_inputs, mesh, capture="direct") as autop:
            assert autop.options().fp32_matmul_precision == "tf32"


def _mlp():
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))


def _mlp_inputs():
    return (torch.empty(4096, 1024),)


@needs_planner
def test_fp32_matmuls_are_priced_by_the_precision():
    with fake_world((2,), ("dp",), device_type="cuda") as mesh:
        with AutoParallel(_mlp(), _mlp_inputs, mesh, capture="direct") as autop:
            graph = autop.graph_json()
            base = autop.options()
    costs = {}
    for precision in ("ieee", "tf32"):
        nodes = enumerate_strategies(graph, base.replace(fp32_matmul_precision=precision))
        costs[precision] = {
            name: min(s["compute_us"] for s in strategies)
            for name, strategies in nodes["nodes"].items()
            if name.startswith(("mm", "addmm"))
        }
    assert costs["ieee"], "the graph has matmuls"
    for name, tf32_us in costs["tf32"].items():
        # H100: 67 TFLOP/s in full float32 against 494.5 with TF32
        assert costs["ieee"][name] > 3 * tf32_us, (name, costs)


def test_measure_on_a_cuda_mesh_says_what_to_use():
    with emulated_cuda(name="NVIDIA H200"), fake_world((2,), ("dp",), device_type="cuda") as mesh:
        with pytest.raises(ValueError) as e:
            measured_hardware("measure", mesh)
    message = str(e.value)
    assert "reads the GPU's name" in message and "'NVIDIA H200'" in message
    assert "bench/calibrate_compute.py" in message and "B200" in message
