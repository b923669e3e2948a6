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
from autoshard.trace.fake_pg import fake_world
from local_ranks import one_program, shards
from autoshard.program.interpreter import rank_local_shape, zero_unless_first

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


class Narrow(nn.Module):
    """Mlp with widths 4 ranks shard unevenly: 10 (3, 3, 3, 1) and 6 (2, 2, 2, 0)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(10, 6)
        self.down = nn.Linear(6, 10, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def test_uneven_batch_is_one_program_for_every_rank():
    """A batch of 10 on 4 ranks (3, 3, 3, 1 rows): the batch dim is a size symbol in the one
    program, and every rank, the last with one row, gets single-device numerics."""
    torch.manual_seed(0)
    model, x = Narrow(), torch.randn(10, 10)
    ref = model(x)
    grad_out = torch.randn_like(ref)
    ref.backward(grad_out)
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        batch = (Shard(0),)
        _, joint, layouts = one_program(
            Narrow, lambda: torch.randn(10, 10), mesh, [batch], [batch], (1.0, 1.0)
        )
        assert layouts[-1] == batch
        x_ph = [n for n in joint.graph.nodes if n.op == "placeholder"][len(layouts) - 1]
        assert isinstance(x_ph.meta["val"].shape[0], torch.SymInt)
        params = list(model.parameters())
        with LocalTensorMode(frozenset(range(mesh.size()))):
            primals = shards([p.detach() for p in params] + [x], layouts, mesh)
            tangent = distribute_tensor(grad_out, mesh, batch).to_local()
            outs = pytree.tree_leaves(joint(*primals, tangent))
            assert outs[0]._local_tensors[3].shape == (1, 10)
            out = DTensor.from_local(
                outs[0], mesh, batch, run_check=False, shape=ref.shape, stride=ref.stride()
            )
            torch.testing.assert_close(out.full_tensor(), ref.detach())
            for k, p in enumerate(params):
                assert layouts[k] == (Replicate(),)  # DDP-like: whole gradients
                for r in range(mesh.size()):
                    torch.testing.assert_close(outs[1 + k]._local_tensors[r], p.grad)


def test_uneven_shard_dtensor_cannot_trace_for_every_rank_is_refused():
    """Parameters sharded unevenly (FSDP-like, width 10 on 4 ranks) need a reduce-scatter
    DTensor cannot trace for every rank at once (it indexes a list by the runtime mesh
    coordinate): refused with the input and the ways out named, not a torch trace error."""
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        batch = (Shard(0),)
        with pytest.raises(NotImplementedError, match="sharded unevenly.*pad that dimension"):
            one_program(Narrow, lambda: torch.randn(8, 10), mesh, [batch], [batch], (0.0, 0.25))


def test_a_trace_that_depends_on_the_tracing_ranks_size_is_refused():
    """A guard on an uneven size (here: the size read as an int) holds on the tracing rank
    only: check_every_rank refuses the program."""
    from autoshard.program.capture import _fake_like
    from autoshard.program.interpreter import rank_varying_dims
    from autoshard.program.passes.uneven import UnevenDims

    with fake_world((4,), ("dp",), device_type="cpu") as mesh:

        class Runner:  # the three things UnevenDims reads of a StepRunner
            def __init__(self):
                self.mesh = mesh

            def global_shape(self, name):
                return (10, 4)

            def placeholder_layout(self, name):
                return (Shard(0),)

            def placeholder_varying_dims(self, name):
                return rank_varying_dims((10, 4), (Shard(0),), mesh)

        uneven = UnevenDims(Runner(), ["x"], [0], symbolic=True)
        assert uneven.dims == {0: [0]}
        shape_env = ShapeEnv()
        fake = _fake_like(FakeTensorMode(shape_env=shape_env), torch.empty(3, 4), [0])
        symbols = uneven.size_symbols({0: fake})
        uneven.check_every_rank(symbols, shape_env)  # nothing guarded yet
        assert int(fake.shape[0]) == 3  # specialises the symbol to this rank's size
        with pytest.raises(NotImplementedError, match="depends on the tracing rank's size"):
            uneven.check_every_rank(symbols, shape_env)


def test_rank_local_shape_is_symbolic_only_while_tracing_for_every_rank():
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        assert rank_local_shape([8, 6], (Shard(1),), mesh) == [8, 2]  # 6 = 2+2+2+0: rank 0
        with dist_config.patch(compile_on_one_rank=True):
            assert rank_local_shape([8, 6], (Shard(1),), mesh) == [8, 2]  # not tracing
            with FakeTensorMode(shape_env=ShapeEnv()):
                assert rank_local_shape([8, 8], (Shard(1),), mesh) == [8, 2]  # even
                size = rank_local_shape([8, 6], (Shard(1),), mesh)[1]
            assert isinstance(size, torch.SymInt)


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
