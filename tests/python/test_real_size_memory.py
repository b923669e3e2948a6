"""Memory at real sizes (issue 40, item 6), emulated on CPU with the meta device standing for
the GPU: a counting dispatch mode records every tensor copied from the host onto it.

- loading full tensors (load_full_state_dict, load_state_dict's hook, init_weights' full
  assignments) copies only this rank's shard to the device, never the full tensor (a 70B
  model's fp32 embedding is 4.2 GB: each rank would hold it whole for a moment), with the
  values distribute_tensor gives (torch.chunk shards, uneven ones included);
- tensor constants reach the device once, not every step (the interpreter's steps, and a
  lowered program holds no copy node)."""

import contextlib
import itertools
import operator

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.runtime.module_state import load_full_state_dict

from autoshard.runtime.module_state import distribute_full_tensors
from autoshard.runtime.parallel_module import _meta_dtensor
from autoshard.trace.fake_pg import init_fake_process_group
from autoshard.runtime.init_weights import full_tensor_init
from autoshard.runtime.local_shard import local_shard
from autoshard.program.interpreter import StepRunner
from autoshard.trace.tracer import trace_training_step

aten = torch.ops.aten


class HostToDevice(TorchDispatchMode):
    """Records the number of elements of every tensor copied from the CPU onto a tensor of
    ``device_type`` (``.to(device)``, ``copy_``)."""

    def __init__(self, device_type: str = "meta"):
        super().__init__()
        self.device_type = device_type
        self.numels: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # (called from inside another mode's handler, `Tensor.to` arrives undecomposed)
        if func.overloadpacket in (aten._to_copy, aten.to, aten.copy_):
            src, dst = (args[1], args[0]) if func is aten.copy_.default else (args[0], out)
            if (
                isinstance(src, torch.Tensor)
                and isinstance(dst, torch.Tensor)
                and src.device.type == "cpu"
                and dst.device.type == self.device_type
            ):
                self.numels.append(src.numel())
        return out


@contextlib.contextmanager
def rank_of(mesh_shape, rank):
    """This process as rank ``rank`` of a fake world (no collective runs: slicing a full
    tensor needs none), with a CPU mesh of ``mesh_shape``."""
    world = 1
    for s in mesh_shape:
        world *= s
    init_fake_process_group(world, rank)
    # DTensor's dispatch caches tell meshes apart by shape and dim names, not by rank: a
    # rank played before in this process would lend its mesh (and coordinate) to the new
    # DTensors of another; dim names of this rank's own keep them apart
    names = tuple(f"d{i}_rank{rank}" for i in range(len(mesh_shape)))
    try:
        yield init_device_mesh("cpu", tuple(mesh_shape), mesh_dim_names=names)
    finally:
        dist.destroy_process_group()


# (mesh shape, rank, global shape, layout): uneven splits (10 rows over 4 ranks: 3, 3, 3, 1),
# two mesh dims on one tensor dim, a negative dim
CASES = [
    ((4,), 1, (10, 6), (Shard(0),)),
    ((4,), 3, (10, 6), (Shard(0),)),
    ((4,), 2, (10, 6), (Shard(-1),)),
    ((2, 2), 3, (10, 6), (Shard(0), Shard(1))),
    ((2, 2), 2, (10, 6), (Shard(0), Shard(0))),
    ((2, 2), 1, (10, 6), (Replicate(), Shard(1))),
]


class Holder(nn.Module):
    """Parameters that are DTensors in given layouts, as the parallel module's are."""

    def __init__(self, mesh, shape, layout, dtype=torch.float32, device="meta"):
        super().__init__()
        w = _meta_dtensor(shape, dtype, layout, mesh)
        if device != "meta":
            w = DTensor.from_local(
                torch.zeros(w._local_tensor.shape, dtype=dtype, device=device),
                mesh,
                layout,
                run_check=False,
                shape=w.shape,
                stride=w.stride(),
            )
        self.w = nn.Parameter(w)
        # as the parallel module's: full tensors in a state dict become this rank's shards
        self.register_load_state_dict_pre_hook(distribute_full_tensors)


def _expected(full, mesh, layout, dtype=None):
    full = full.to(dtype or full.dtype)
    return distribute_tensor(full, mesh, layout, src_data_rank=None).to_local()


@pytest.mark.parametrize("mesh_shape, rank, shape, layout", CASES)
def test_local_shard_is_distribute_tensors_shard(mesh_shape, rank, shape, layout):
    full = torch.randn(shape)
    with rank_of(mesh_shape, rank) as mesh:
        for dtype in (torch.float32, torch.bfloat16):
            got = local_shard(full, mesh, layout, device="cpu", dtype=dtype)
            want = _expected(full, mesh, layout, dtype)
            assert got.shape == want.shape and torch.equal(got, want)
            assert got.is_contiguous()
            # never a view of the caller's tensor (a later write to it must not leak in)
            assert got.untyped_storage().data_ptr() != full.untyped_storage().data_ptr()
        # Partial (not a parameter layout, but a valid one): as distribute_tensor splits it
        partial = tuple(Partial() if isinstance(p, Replicate) else p for p in layout)
        got = local_shard(full, mesh, partial, device="cpu")
        assert torch.equal(got, _expected(full, mesh, partial))


@pytest.mark.parametrize("mesh_shape, rank, shape, layout", CASES)
def test_load_full_state_dict_copies_only_the_shard_to_the_device(mesh_shape, rank, shape, layout):
    full = torch.randn(shape)
    with rank_of(mesh_shape, rank) as mesh:
        on_device = Holder(mesh, shape, layout)
        shard = on_device.w._local_tensor.numel()
        assert shard < full.numel() or all(p.is_replicate() for p in layout)
        with HostToDevice() as copies:
            load_full_state_dict(on_device, {"w": full})
        assert copies.numels and max(copies.numels) == shard, copies.numels
        # the values, on a CPU "device" in bf16: distribute_tensor's
        on_cpu = Holder(mesh, shape, layout, dtype=torch.bfloat16, device="cpu")
        load_full_state_dict(on_cpu, {"w": full})
        assert torch.equal(on_cpu.w._local_tensor, _expected(full, mesh, layout, torch.bfloat16))


@pytest.mark.parametrize("mesh_shape, rank, shape, layout", CASES[:4])
def test_load_state_dict_hook_copies_only_the_shard(mesh_shape, rank, shape, layout):
    full = torch.randn(shape)
    with rank_of(mesh_shape, rank) as mesh:
        on_device = Holder(mesh, shape, layout)
        state = {"w": full}
        with HostToDevice() as copies:
            distribute_full_tensors(on_device, state, "")
        assert copies.numels and max(copies.numels) == on_device.w._local_tensor.numel()
        assert isinstance(state["w"], DTensor) and state["w"].placements == tuple(
            Shard(p.dim % len(shape)) if isinstance(p, Shard) else p for p in layout
        )
        on_cpu = Holder(mesh, shape, layout, device="cpu")
        state = {"w": full}
        distribute_full_tensors(on_cpu, state, "")
        assert torch.equal(state["w"]._local_tensor, _expected(full, mesh, layout))
        on_cpu.load_state_dict({"w": full})  # torch's own load, through the hook
        assert torch.equal(on_cpu.w._local_tensor, _expected(full, mesh, layout))


ASSIGNMENTS = {
    "parameter": lambda m, full: setattr(m, "w", nn.Parameter(full)),
    "copy_": lambda m, full: m.w.copy_(full),
    "data": lambda m, full: setattr(m.w, "data", full),
    "broadcast row": lambda m, full: m.w.copy_(full[0]),
}


@pytest.mark.parametrize("how", list(ASSIGNMENTS))
@pytest.mark.parametrize("mesh_shape, rank, shape, layout", [CASES[1], CASES[3]])
def test_init_weights_assignments_copy_only_the_shard(how, mesh_shape, rank, shape, layout):
    full = torch.randn(shape)
    value = full[0].expand(shape) if how == "broadcast row" else full
    with rank_of(mesh_shape, rank) as mesh:
        on_device = Holder(mesh, shape, layout)
        with HostToDevice() as copies, torch.no_grad(), full_tensor_init():
            ASSIGNMENTS[how](on_device, full)
        assert copies.numels and max(copies.numels) == on_device.w._local_tensor.numel()
        on_cpu = Holder(mesh, shape, layout, device="cpu")
        with torch.no_grad(), full_tensor_init():
            ASSIGNMENTS[how](on_cpu, full)
        assert torch.equal(on_cpu.w._local_tensor, _expected(value.contiguous(), mesh, layout))


# ---- constants ------------------------------------------------------------------------------
class WithConstant(nn.Module):
    """A tensor built in forward from literals: a constant of the traced graph (get_attr)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return (self.lin(x) * torch.tensor([1.0, 2.0, 3.0, 4.0])).pow(2).mean()


@pytest.fixture(scope="module")
def constant_step():
    with torch.device("meta"):
        model = WithConstant()
    step = trace_training_step(model, lambda: torch.empty(8, 4), capture="direct")
    assert step.gm.graph.find_nodes(op="get_attr"), "expected a tensor constant"
    return step


def _meta_runner(step):
    """A one-rank runner whose device is meta: every copy of the (CPU) constant to it is a
    host-to-device copy."""
    mesh = init_device_mesh("cpu", (1,))
    return StepRunner(step, {"nodes": {}}, mesh, device=torch.device("meta"))


def _meta_args(runner):
    params = [torch.empty(4, 4, device="meta"), torch.empty(4, device="meta")]
    return params, [], [torch.empty(8, 4, device="meta")]


def test_interpreted_steps_copy_constants_to_the_device_once(constant_step):
    with rank_of((1,), 0):
        runner = _meta_runner(constant_step)
        runner.run_forward(*_meta_args(runner))
        # the first step left the constant on the device ...
        (on_device,) = runner._device_constants.values()
        assert on_device.device.type == "meta" and on_device.numel() == 4
        with HostToDevice() as second:
            runner.run_forward(*_meta_args(runner))
    assert second.numels == []  # ... and the next one copies nothing


def test_lowered_program_holds_the_constant_on_the_device(constant_step):
    """A program traced with a copy of the constant would run that copy every step."""
    from autoshard.program.lowering import lower_step

    with rank_of((1,), 0):
        runner = _meta_runner(constant_step)
        program = lower_step(runner, *_meta_args(runner))
    gm = program.fwd_gm
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem:
            reads_constant = any(a.op == "get_attr" for a in n.all_input_nodes)
            assert not (reads_constant and n.target is aten._to_copy.default), n.format_node()
    consts = [getattr(gm, n.target) for n in gm.graph.find_nodes(op="get_attr")]
    assert any(c.device.type == "meta" and c.numel() == 4 for c in consts)


def test_constants_already_on_the_device_are_not_copied(constant_step):
    with rank_of((1,), 0):
        mesh = init_device_mesh("cpu", (1,))
        runner = StepRunner(constant_step, {"nodes": {}}, mesh)  # cpu device, cpu constant
        name = next(iter(runner.constants))
        assert runner._constant_on_device(name) is runner.constants[name]


def test_shapes_of_every_case_are_uneven_somewhere():
    """The cases cover an uneven split (the last rank's shard is shorter)."""
    sizes = set()
    for mesh_shape, rank, shape, layout in CASES:
        with rank_of(mesh_shape, rank) as mesh:
            sizes.add(tuple(local_shard(torch.empty(shape), mesh, layout, device="cpu").shape))
    assert (1, 6) in sizes and (3, 6) in sizes


def test_all_placement_combinations_on_a_2x3_mesh():
    full = torch.arange(70.0).view(10, 7)
    placements = [Shard(0), Shard(1), Replicate()]
    for rank in range(6):
        with rank_of((2, 3), rank) as mesh:
            for layout in itertools.product(placements, repeat=2):
                got = local_shard(full, mesh, layout, device="cpu")
                assert torch.equal(got, _expected(full, mesh, layout)), (rank, layout)
