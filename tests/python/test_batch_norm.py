"""BatchNorm in training: batch statistics over the whole (sharded) batch, as the single-
device model computes them (synchronised BatchNorm), running statistics written back into
the module's buffers, and eval mode using them."""

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import DTensor, Shard

from autoshard import AutoParallel, _core
from autoshard.trace.fake_pg import fake_world
from autoshard import models
from local_ranks import one_program, shards

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


class ConvBn(models.ConvBn):
    """The features (not the loss): outputs to compare with one device."""

    def forward(self, x):
        return self.features(x)


def _x():
    return torch.randn(8, 3, 6, 6)


def _buffers(m: nn.Module) -> dict:
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v) for k, v in m.named_buffers()}


def test_batch_statistics_span_every_ranks_shard():
    """Four ranks (compile_on_one_rank, LocalTensorMode), batch sharded: outputs and the
    running statistics every rank writes equal the single-device model's. (Before the tests
    using mesh1, which holds a gloo group until the module ends.)"""
    torch.manual_seed(0)
    ref = ConvBn()
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    x = _x()
    ref_out = ref(x)
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        batch = (Shard(0),)
        autop, joint, layouts = one_program(ConvBn, _x, mesh, [batch], [batch])
        fqns = list(autop.step.param_fqns.values()) + list(autop.step.buffer_fqns.values())
        with LocalTensorMode(frozenset(range(4))):
            locals_ = shards([before[f] for f in fqns] + [x], layouts, mesh)
            outs = pytree.tree_leaves(joint(*locals_, torch.ones(2, 4)))
            got = DTensor.from_local(outs[0], mesh, batch, run_check=False).full_tensor()
            torch.testing.assert_close(got, ref_out.detach(), atol=1e-4, rtol=1e-4)
            after = dict(ref.named_buffers())
            for k, f in enumerate(fqns):
                if f in after:
                    written = DTensor.from_local(locals_[k], mesh, layouts[k], run_check=False)
                    torch.testing.assert_close(written.full_tensor(), after[f], msg=f)


@pytest.mark.parametrize(
    "runtime, compile", [("program", False), ("interpret", False), ("program", True)]
)
def test_training_steps_and_eval_match_one_device(mesh1, runtime, compile):
    torch.manual_seed(0)
    ref = ConvBn()
    with torch.device("meta"):
        meta = ConvBn()
    with AutoParallel(meta, _x, mesh1, runtime=runtime, compile=compile) as autop:
        parallel = autop.apply_placement(autop.optimize_placement())
    parallel.to_empty(device="cpu")
    parallel.load_state_dict(ref.state_dict())
    for _ in range(2):
        x = _x()
        out, ref_out = parallel(x), ref(x)
        torch.testing.assert_close(out, ref_out)
        # not a function of the normalised values' own statistics (sum(out**2) is constant
        # under BatchNorm, its gradients pure rounding noise)
        weights = torch.randn_like(out)
        (out * weights).sum().backward()
        (ref_out * weights).sum().backward()
        for (name, p), q in zip(parallel.named_parameters(), ref.parameters()):
            # batch statistics as mean + sum of squared deviations (decompositions.py),
            # not torch's one-kernel var_mean: equal up to float32 rounding of sums
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, atol=1e-4, rtol=1e-4, msg=name)
        for name, b in _buffers(parallel).items():
            torch.testing.assert_close(b, dict(ref.named_buffers())[name], msg=name)
    x = _x()
    with torch.no_grad():  # training mode without autograd: the statistics still move
        torch.testing.assert_close(parallel(x), ref(x))
    for name, b in _buffers(parallel).items():
        torch.testing.assert_close(b, dict(ref.named_buffers())[name], msg=name)
    parallel.eval()
    ref.eval()
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(parallel(x), ref(x))
