"""forward() writing a buffer or an input in place (``self.steps += 1``, ``x.mul_(s)``):
the planned step writes the new values back into the tensors passed in (each rank's shard),
as the single-device model does; what cannot be written back is refused by name."""

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoshard import AutoParallel, _core
from autoshard.trace.fake_pg import fake_world
from local_ranks import one_program, shards
from autoshard.trace.tracer import UnsupportedModelError, trace_training_step

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


class Writes(nn.Module):
    """Scales its input in place, then counts its calls in a buffer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x, scale):
        scale.mul_(2.0)
        x.add_(1.0)
        y = self.lin(x) * scale  # reads the new values; the backward too
        self.calls += 1
        return y.pow(2).mean()


def _inputs():
    return torch.randn(8, 16), torch.full((16,), 0.5)


def test_writes_land_on_every_ranks_shard():
    """Four ranks at once (compile_on_one_rank, LocalTensorMode): the batch-sharded input
    gets each rank's rows written, the replicated buffer every rank's copy. (Before the
    tests using mesh1, which holds a gloo group until the module ends.)"""
    torch.manual_seed(0)
    ref = Writes()
    x, scale = _inputs()
    x_ref, scale_ref = x.clone(), scale.clone()
    ref(x_ref, scale_ref)
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        _, joint, layouts = one_program(Writes, _inputs, mesh, [(Shard(0),), (Replicate(),)])
        with LocalTensorMode(frozenset(range(4))):
            full = [ref.lin.weight.detach(), ref.lin.bias.detach(), torch.zeros(()), x, scale]
            locals_ = shards(full, layouts, mesh)
            pytree.tree_leaves(joint(*locals_, torch.ones(())))

            def full_of(k):
                return DTensor.from_local(locals_[k], mesh, layouts[k], run_check=False)

            assert torch.equal(full_of(3).full_tensor(), x_ref)
            assert torch.equal(full_of(4).full_tensor(), scale_ref)
            assert full_of(2).full_tensor().item() == 1.0


@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_writes_reach_the_callers_tensors_and_match_one_device(mesh1, runtime):
    torch.manual_seed(0)
    ref = Writes()
    with torch.device("meta"):
        meta = Writes()
    with AutoParallel(meta, _inputs, mesh1, runtime=runtime) as autop:
        parallel = autop.apply_placement(autop.optimize_placement())
    parallel.to_empty(device="cpu")
    parallel.load_state_dict(ref.state_dict())
    for _ in range(2):  # two steps: the second starts from the first one's writes
        x, scale = _inputs()
        x_ref, scale_ref = x.clone(), scale.clone()
        loss = parallel(x, scale)
        loss.backward()
        ref.zero_grad()
        ref_loss = ref(x_ref, scale_ref)
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss)
        assert torch.equal(x, x_ref) and torch.equal(scale, scale_ref)
        for (name, p), q in zip(parallel.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=name)
        parallel.zero_grad()
    assert parallel.calls.full_tensor().item() == ref.calls.item() == 2.0


class WritesParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.mul_(0.5)
        return self.lin(x).sum()


class WritesShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        x.t_()
        return self.lin(x).sum()


def test_writes_that_cannot_be_written_back_are_refused_by_name():
    with pytest.raises(UnsupportedModelError, match=r"parameters change in the optimizer step"):
        trace_training_step(WritesParameter().to("meta"), lambda: torch.empty(4, 4))
    with pytest.raises(
        UnsupportedModelError, match=r"input 0 in place, and that input requires grad"
    ):
        trace_training_step(
            Writes().to("meta"), lambda: (torch.ones(8, 16).requires_grad_(), torch.ones(16))
        )
    with pytest.raises(
        UnsupportedModelError, match=r"changes the shape, dtype or layout of input 0"
    ):
        trace_training_step(WritesShape().to("meta"), lambda: torch.empty(4, 4))
