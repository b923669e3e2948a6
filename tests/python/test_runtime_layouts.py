"""The reference runtime's own redistributions, on a fake process group (one process plays
any rank: collectives are no-ops, local results are this rank's)."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor


@pytest.mark.parametrize("rank", [0, 1])
def test_replicated_to_partial_sum_keeps_one_copy_per_group(rank):
    """DTensor refuses R -> P; plans may ask for it. On a (2, 2) mesh, going to (P(sum), S(0))
    from (R, R): dim 1 is sliced, and along dim 0 only coordinate 0 keeps the value, so the
    sum over the group is the value itself (exact, integers too)."""
    from types import SimpleNamespace

    from torch.distributed.tensor import Partial, Replicate, Shard

    from autoshard.trace.fake_pg import init_fake_process_group
    from autoshard.program.interpreter import StepRunner

    init_fake_process_group(4, rank=rank * 2)  # mesh coordinate (rank, 0)
    try:
        mesh = init_device_mesh("cpu", (2, 2))
        value = torch.arange(12).reshape(4, 3)
        rep = DTensor.from_local(value, mesh, (Replicate(), Replicate()), run_check=False)
        runner = SimpleNamespace(mesh=mesh)
        out = StepRunner._to_layout(runner, rep, (Partial("sum"), Shard(0)))
        assert out.placements == (Partial("sum"), Shard(0)) and out.shape == (4, 3)
        want = value[:2] if rank == 0 else torch.zeros_like(value[:2])
        assert torch.equal(out.to_local(), want)
        avg = StepRunner._to_layout(runner, rep.float(), (Partial("avg"), Replicate()))
        assert torch.equal(avg.to_local(), value.float())  # every rank keeps an average's value
    finally:
        dist.destroy_process_group()
