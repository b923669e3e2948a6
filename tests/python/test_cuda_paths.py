"""What only a GPU can prove of issue 40's items 3, 4 and 8 (marked ``cuda``: skipped
without a CUDA device; scripts/gpu_check.sh runs them): on a 1-rank NCCL mesh, DTensor's
CUDA random ops are traced as run_dtensor_rng_op and seen by rng_check, the generator
compared is CUDA's, the arrival check passes without a collective, the lowered program
defers nothing on NCCL, and its steps copy no value to the host."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from autoshard import AutoParallel, _core
from autoshard.runtime.module_runtime import runtime_of
from test_host_syncs import HostSyncs

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
    ),
]


@pytest.fixture(scope="module")
def cuda_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cuda", (1,), mesh_dim_names=("dp",))
    finally:
        dist.destroy_process_group()


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(self.drop(torch.relu(self.up(x)))).pow(2).mean()


def _planned(model_cls, mesh, shape):
    torch.manual_seed(0)
    ref = model_cls().cuda()
    with torch.device("meta"):
        meta = model_cls()
    with AutoParallel(meta, lambda: (torch.empty(*shape),), mesh, time_limit_s=5.0) as autop:
        par = autop.apply_placement(autop.optimize_placement())
    par.to_empty(device="cuda")
    par.load_state_dict(ref.state_dict())
    return par


def test_cuda_random_ops_are_traced_as_dtensor_rng_ops_and_seen(cuda_mesh):
    from autoshard.program.rng_check import random_nodes

    par = _planned(DropoutNet, cuda_mesh, (8, 16))
    x = torch.randn(8, 16, device="cuda")
    par(x).backward()  # lowers and runs the program
    program = runtime_of(par).program
    found = random_nodes(program.fwd_gm)
    assert found, f"no random op found in the lowered forward:\n{program.fwd_gm.graph}"
    names = {getattr(n.target, "__name__", str(n.target)) for n in found}
    print("random nodes:", names)


def test_the_generator_compared_is_the_cuda_one():
    from autoshard.program.rng_check import _state_digest, generator_state

    dev = torch.device("cuda", torch.cuda.current_device())
    assert torch.equal(generator_state(dev), torch.cuda.get_rng_state(dev))
    torch.cuda.manual_seed(1)
    before = _state_digest(dev)
    torch.manual_seed(123)  # the CPU generator moves: the CUDA run's digest does not
    torch.cuda.manual_seed(1)
    assert _state_digest(dev) == before
    torch.cuda.manual_seed(2)
    assert _state_digest(dev) != before


def test_nccl_meshes_defer_nothing_and_steps_do_not_sync(cuda_mesh):
    from autoshard.program.passes.deferred_tail import defers_round_trips

    assert defers_round_trips(cuda_mesh) is False
    par = _planned(
        lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)), cuda_mesh, (8, 16)
    )
    x = torch.randn(8, 16, device="cuda")
    par(x).sum().backward()
    program = runtime_of(par).program
    assert program.split is None and program.info["deferred_round_trips"] == 0
    with HostSyncs() as seen:
        for _ in range(3):
            par(x).sum().backward()
    torch.cuda.synchronize()
    assert seen.ops == [], seen.ops


def test_the_arrival_check_uses_the_store_on_nccl(cuda_mesh):
    from autoshard.planning.rank_agreement import arrive_and_agree

    store = dist.distributed_c10d._get_default_store()
    assert arrive_and_agree(store, 0, 1, "cuda_test/", 5.0) == ([], False)


def test_trainer_batches_go_up_pinned_and_unblocked():
    import importlib
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "examples"))
    try:
        train = importlib.import_module("train")
    finally:
        sys.path.remove(str(REPO / "examples"))
    host = torch.arange(12).view(3, 4)
    moved = train.to_device(host, torch.device("cuda", 0))
    assert moved.device.type == "cuda" and torch.equal(moved.cpu(), host)
