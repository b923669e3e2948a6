"""One program for every rank (torch.distributed.config.compile_on_one_rank): the lowered
step reads mesh coordinates at run time instead of baking in the tracing rank's, so
``autop.parallel_gm`` traced on a fake process group computes every rank's shard when run
under torch's LocalTensorMode (each LocalTensor holds all ranks' values). Checked against
single-device forward and backward numerics."""

import pytest
import torch
import torch.distributed.config as dist_config
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from autoshard import _core
from autoshard.fake_pg import fake_world
from local_ranks import one_program, shards
from autoshard.runtime import rank_local_shape, zero_unless_first

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

BATCH, DIM, HIDDEN = 8, 16, 32


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.parametrize(
    "shape, names, param_share",
    [
        ((2, 2), ("dp", "tp"), None),  # the planner's choice
        ((2, 2), ("dp", "tp"), (0.0, 0.25)),  # parameters sharded on both dims
        ((4,), ("dp",), (0.0, 0.25)),  # FSDP-like: gathers, then each rank's chunk
    ],
)
def test_parallel_gm_matches_single_device_on_every_rank(shape, names, param_share):
    torch.manual_seed(0)
    model = Mlp()
    x = torch.randn(BATCH, DIM)
    ref = model(x)
    grad_out = torch.randn_like(ref)
    ref.backward(grad_out)
    with fake_world(shape, names, device_type="cpu") as mesh:
        batch_layout = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)
        _, joint, layouts = one_program(
            Mlp,
            lambda: torch.randn(BATCH, DIM),
            mesh,
            [batch_layout],
            [batch_layout],
            param_share,
        )
        params = list(model.parameters())
        with LocalTensorMode(frozenset(range(mesh.size()))):
            primals = shards([p.detach() for p in params] + [x], layouts, mesh)
            tangent = distribute_tensor(grad_out, mesh, batch_layout).to_local()
            outs = pytree.tree_leaves(joint(*primals, tangent))

            def gathered(local, layout):
                return DTensor.from_local(local, mesh, layout, run_check=False).full_tensor()

            torch.testing.assert_close(gathered(outs[0], batch_layout), ref.detach())
            for k, p in enumerate(params):  # gradients leave in their parameter's layout
                torch.testing.assert_close(gathered(outs[1 + k], layouts[k]), p.grad)


def test_uneven_shard_is_refused_when_one_program_serves_every_rank():
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        assert rank_local_shape([8, 6], (Shard(1),), mesh) == [8, 2]  # 6 = 2+2+2+0: rank 0
        with dist_config.patch(compile_on_one_rank=True):
            assert rank_local_shape([8, 8], (Shard(1),), mesh) == [8, 2]
            with pytest.raises(NotImplementedError, match="sharded unevenly"):
                rank_local_shape([8, 6], (Shard(1),), mesh)


def test_sum_partial_from_replicate_keeps_the_value_on_the_first_rank_only():
    with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
        t = torch.ones(3)
        assert torch.equal(zero_unless_first(t, mesh, 1), t)  # the fake rank 0
        with LocalTensorMode(frozenset(range(4))) as mode:
            local = mode.rank_map(lambda r: torch.full((3,), 1.0 + r))
            kept = zero_unless_first(local, mesh, 1)
        # ranks (0,0)=0 and (1,0)=2 are first on the tp dim
        assert [kept._local_tensors[r][0].item() for r in range(4)] == [1.0, 0.0, 3.0, 0.0]
        # traced once for every rank: the coordinate is read when the graph runs
        with dist_config.patch(compile_on_one_rank=True):
            fake = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
            gm = make_fx(lambda v: zero_unless_first(v, mesh, 1), tracing_mode="fake")(
                fake.from_tensor(t, static_shapes=True)
            )
        assert any("_runtime_compute_coordinate_on_dim" in str(n.target) for n in gm.graph.nodes)
        with LocalTensorMode(frozenset(range(4))) as mode:
            kept = gm(mode.rank_map(lambda r: torch.full((3,), 1.0 + r)))
        assert [kept._local_tensors[r][0].item() for r in range(4)] == [1.0, 0.0, 3.0, 0.0]
