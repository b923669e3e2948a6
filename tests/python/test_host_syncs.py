"""Per-step host syncs and copies, which CPU runs hide (a value copied to the host costs
nothing on CPU, and gloo's waits block anyway) but which stall a GPU every step:

- the planned step on one rank copies no value to the host (no ``_local_scalar_dense``,
  counted by a dispatch mode), also when the call passes an argument's default;
- binding a call never compares tensors on the host (binding._is_default);
- the example trainer reads the loss at log points only, and moves batches to a GPU
  through pinned memory without blocking;
- the deferred forward tail and the late loss scale (for gloo's blocking waits) are off
  where every mesh dim's group waits on the device (NCCL), on for gloo."""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import Shard
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard import AutoParallel, _core
from autoshard.trace.input_binding import _is_default
from autoshard.program.passes.deferred_tail import backend_for_device, defers_round_trips
from autoshard.trace.fake_pg import fake_world
from autoshard.models import MLP
from autoshard.runtime.module_runtime import runtime_of
from conftest import REPO

needs_planner = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)
aten = torch.ops.aten


class HostSyncs(TorchDispatchMode):
    """Counts ops that copy a tensor's value to the host (what ``.item()``, ``bool(t)`` and
    ``float(t)`` come down to); on a GPU each one waits for the device."""

    SYNCING = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.item.default}

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNCING:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


# ---- binding --------------------------------------------------------------------------------
def test_binding_compares_no_tensor_values():
    with HostSyncs() as seen:
        assert not _is_default(torch.tensor(1.0), 1.0)
        assert not _is_default(torch.tensor([0.5]), 0.5)
        assert not _is_default({"w": torch.tensor(2)}, {"w": 2})
    assert seen.ops == []
    assert _is_default(None, None) and _is_default(3, 3) and _is_default("mean", "mean")
    assert not _is_default(4, 3)


class Scaled(nn.Module):
    """An argument left out of the traced call, passed later with its default."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        return (self.lin(x) * scale).pow(2).mean()


@pytest.fixture
def gloo1():
    """A one-rank gloo mesh for one test (this module also builds fake worlds)."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@needs_planner
def test_one_rank_steps_copy_no_value_to_the_host(gloo1):
    torch.manual_seed(0)
    ref = Scaled()
    with torch.device("meta"):
        meta = Scaled()
    with AutoParallel(
        meta, lambda: (torch.empty(4, 8),), gloo1, time_limit_s=2.0, capture="direct"
    ) as autop:
        par = autop.apply_placement(autop.optimize_placement())
    par.to_empty(device="cpu")
    par.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8)
    par(x).backward()  # the first step: lowering, checks done once
    with HostSyncs() as seen:
        for _ in range(3):
            par(x, scale=1.0).backward()
    assert seen.ops == [], f"host syncs in 3 steps: {seen.ops}"


# ---- the example trainer --------------------------------------------------------------------
@pytest.fixture(scope="module")
def train_example():
    sys.path.insert(0, str(REPO / "examples"))
    try:
        yield importlib.import_module("train")
    finally:
        sys.path.remove(str(REPO / "examples"))


def test_trainer_reads_the_loss_at_log_points_only(train_example):
    torch.manual_seed(0)
    model = MLP(dim=8, hidden=16, layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = (torch.randn(4, 8), torch.randn(4, 8))
    logged = []
    with HostSyncs() as seen:
        last = train_example.train_steps(
            model,
            opt,
            lambda n: batch,
            torch.device("cpu"),
            step=0,
            last=6,
            log_freq=3,
            on_log=lambda n, loss, rate: logged.append((n, loss, rate)),
        )
    assert last == 6 and [n for n, *_ in logged] == [3, 6]
    assert all(isinstance(loss, float) and rate > 0 for _, loss, rate in logged)
    assert len(seen.ops) == 2, seen.ops  # one loss read per log point, none in between


def test_trainer_moves_batches_to_a_gpu_through_pinned_memory(train_example):
    batch = mock.MagicMock(spec=torch.Tensor)
    pinned = batch.pin_memory.return_value
    cuda = torch.device("cuda", 1)
    train_example.to_device(batch, cuda)
    batch.pin_memory.assert_called_once_with()
    pinned.to.assert_called_once_with(cuda, non_blocking=True)
    host = torch.ones(2)
    assert train_example.to_device(host, torch.device("cpu")) is host  # CPU: no copy


# ---- deferral by backend --------------------------------------------------------------------
def test_backend_for_device_reads_per_device_spellings():
    assert backend_for_device("gloo", "cpu") == "gloo"
    assert backend_for_device("NCCL", "cuda") == "nccl"
    assert backend_for_device("cpu:gloo,cuda:nccl", "cuda") == "nccl"
    assert backend_for_device("cpu:gloo,cuda:nccl", "cpu") == "gloo"


def _mesh(backends: list[str], device_type: str = "cuda"):
    return SimpleNamespace(
        ndim=len(backends), device_type=device_type, get_group=lambda d: backends[d]
    )


@pytest.mark.parametrize(
    "backends, device_type, defer",
    [
        (["nccl"], "cuda", False),  # waits are stream dependencies: nothing to defer
        (["nccl", "nccl"], "cuda", False),
        (["cpu:gloo,cuda:nccl"], "cuda", False),
        (["gloo"], "cpu", True),  # gloo's waits block the host
        (["cpu:gloo,cuda:nccl"], "cpu", True),
        (["nccl", "gloo"], "cuda", True),  # one blocking dim is enough
        (["fake"], "cpu", True),  # planning-only groups keep the default
    ],
)
def test_deferral_is_chosen_by_the_backend(monkeypatch, backends, device_type, defer):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: group)
    assert defers_round_trips(_mesh(backends, device_type)) is defer


class Classifier(nn.Module):
    """Many classes, so the planner keeps the batch sharded: the forward ends with the
    mean loss's all-reduce (what deferred_tail defers) and the backward divides by the
    all-reduced count of targets (what late_loss_scale moves)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 4096)

    def forward(self, x, target):
        return nn.functional.cross_entropy(self.head(x), target)


def _lowered(mesh):
    with torch.device("meta"):
        model = Classifier()
    inputs = lambda: (torch.empty(256, 64), torch.empty(256, dtype=torch.long))  # noqa: E731
    with AutoParallel(
        model, inputs, mesh, hardware="CPU", capture="direct", time_limit_s=5.0
    ) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        par = autop.apply_placement(autop.optimize_placement())
    par.to_empty(device="cpu")
    par.parallel_gm  # lowers the training step
    return runtime_of(par).program


@needs_planner
@pytest.mark.parametrize("backend", ["fake", "nccl"])
def test_lowering_defers_round_trips_only_where_waits_block(monkeypatch, backend):
    with fake_world((4,), device_type="cpu") as mesh:
        if backend == "nccl":  # the mesh's groups say NCCL; the world stays fake (no checks)
            monkeypatch.setattr(
                dist, "get_backend", lambda group=None: "fake" if group is None else "nccl"
            )
        program = _lowered(mesh)
    info = program.info
    if backend == "nccl":
        assert program.split is None and info["deferred_forward_outputs"] == 0
        assert info["deferred_round_trips"] == 0 and info["late_loss_scale"] == 0
    else:
        assert info["deferred_round_trips"] == 1 and info["late_loss_scale"] == 1
        assert program.split is not None and info["deferred_forward_outputs"] >= 1
