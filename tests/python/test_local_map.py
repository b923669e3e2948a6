"""autoshard.local_map regions (python/autoshard/local_map_region.py) and the collectives for
them (python/autoshard/collectives.py): a region is planned as one op with exactly its
declared placements (fake meshes of 4, 2x2 and 8x8 ranks, collectives inside traced on the
fake process group), its gradient comes out in in_grad_placements, and a model of regions
with all_reduce / all_gather / reduce_scatter / all_to_all inside trains on 4 gloo ranks like
the single-process model (docs/local_map.md)."""

import json

import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard

import autoshard
from autoshard import AutoParallel, _core
from autoshard import collectives as C
from autoshard.ops import local_map_collectives
from autoshard.trace.fake_pg import fake_world
from conftest import ok_on_every_rank, run_torchrun
from local_map_models import DIM, RegionNet

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


class Scaled(nn.Module):
    """mm (free for the planner) -> a region with declared layouts -> mm."""

    def __init__(self, region):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(32, 32))
        self.w2 = nn.Parameter(torch.empty(32, 32))
        self.region = region

    def forward(self, x):
        return (self.region(x @ self.w1) @ self.w2).sum()


def _softsign(h):
    return h / (1 + h.abs())


def _plan(model, mesh, batch=32, dim=32):
    with AutoParallel(model, lambda: (torch.empty(batch, dim),), mesh) as autop:
        graph = json.loads(autop.graph_json())
        return graph, autop.optimize_placement().plan


def _nodes(plan, prefix):
    return {k: v for k, v in plan["nodes"].items() if k.startswith(prefix)}


@pytest.mark.parametrize(
    "shape,names,layout",
    [
        ((4,), ("tp",), (Shard(0),)),
        ((4,), ("tp",), (Shard(1),)),
        ((2, 2), ("dp", "tp"), (Shard(0), Shard(1))),
        ((2, 2), ("dp", "tp"), (Shard(1), Replicate())),
    ],
)
def test_region_is_planned_with_its_declared_placements(shape, names, layout):
    from autoshard.placements import layout_to_strs

    with fake_world(shape, names, device_type="cpu") as mesh:
        region = autoshard.local_map(
            _softsign,
            out_placements=layout,
            in_placements=(layout,),
            redistribute_inputs=True,
            device_mesh=mesh,
        )
        with torch.device("meta"):
            model = Scaled(region)
        graph, plan = _plan(model, mesh)
    want = layout_to_strs(layout)
    (fwd,) = [v for k, v in _nodes(plan, "local_map").items() if "backward" not in k]
    assert fwd["inputs"] == [want] and fwd["outputs"][1] == want
    (bwd,) = _nodes(plan, "local_map_backward").values()
    assert bwd["inputs"] == [want, want]  # the output gradient, the saved input
    assert bwd["outputs"][1] == want  # the input gradient: in_placements by default
    # the graph carries one row per mesh dim (the planner keeps the declared combination)
    (entry,) = [n for n in graph["nodes"] if n["op"] == "autoshard.local_map.default"]
    assert len(entry["strategies"]) == len(shape)


def test_region_on_a_3d_mesh_keeps_every_declared_dim():
    """A 3-D tensor declared (S(0), S(1), S(2)) on a 2x2x2 mesh: each mesh dim shards its own
    tensor dim (the planner, free, would pick fewer splits for this elementwise chain)."""
    with fake_world((2, 2, 2), ("dp", "tp", "cp"), device_type="cpu") as mesh:
        lay = (Shard(0), Shard(1), Shard(2))
        region = autoshard.local_map(
            _softsign, out_placements=lay, in_placements=(lay,), device_mesh=mesh
        )

        class Cube(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.empty(8, 8))

            def forward(self, x):
                return region(x @ self.w).sum()

        with torch.device("meta"):
            model = Cube()
        with AutoParallel(model, lambda: (torch.empty(8, 8, 8),), mesh) as autop:
            plan = autop.optimize_placement().plan
    assert plan["nodes"]["local_map"]["inputs"] == [["S(0)", "S(1)", "S(2)"]]
    assert plan["nodes"]["local_map"]["outputs"][1] == ["S(0)", "S(1)", "S(2)"]
    assert plan["nodes"]["local_map_backward"]["outputs"][1] == ["S(0)", "S(1)", "S(2)"]


def test_region_with_collectives_plans_on_a_fake_8x8_mesh():
    """All five regions of RegionNet (all_reduce, all_gather, reduce_scatter, all_to_all
    inside) traced on the fake process group of 64 ranks: every region and its backward get
    exactly their declared layouts, gradients in in_grad_placements."""
    with fake_world((8, 8), ("dp", "tp"), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = RegionNet(mesh)
        with AutoParallel(
            model, lambda: (torch.empty(64, DIM), torch.empty(64, DIM)), mesh
        ) as autop:
            lay = (Shard(0), Shard(0))
            autop.add_input_constraints([lay, lay])
            plan = autop.optimize_placement().plan
    nodes = plan["nodes"]
    # forward regions in model order: matmul_allreduce, gate, swap, matmul_scatter, gather
    assert nodes["local_map"]["inputs"] == [["S(0)", "S(1)"], ["R", "S(0)"]]
    assert nodes["local_map"]["outputs"][1] == ["S(0)", "R"]
    assert nodes["local_map_1"]["inputs"] == [["S(0)", "S(0)"], ["R", "R"]]
    assert nodes["local_map_2"]["outputs"][1] == ["S(0)", "S(1)"]
    assert nodes["local_map_3"]["outputs"][1] == ["S(0)", "S(0)"]
    assert nodes["local_map_4"]["outputs"][1] == ["S(0)", "R"]
    # backward of gate: grad of s declared Partial on both mesh dims
    grads = {
        tuple(map(tuple, v["outputs"][1:]))
        for k, v in nodes.items()
        if k.startswith("local_map_backward")
    }
    assert (("S(0)", "S(0)"), ("P(sum)", "P(sum)")) in grads
    assert (("S(0)", "S(1)"), ("P(sum)", "S(0)")) in grads  # the row-sharded weights


def test_collectives_resolve_axes_and_check_them():
    with fake_world((2, 4), ("dp", "tp"), device_type="cpu") as mesh:
        seen = {}

        def body(x):
            seen.update(tp=C.axis_size("tp"), dp=C.axis_size(0), idx=C.axis_index("tp"))
            with pytest.raises(ValueError, match="no dim named 'ep'"):
                C.axis_size("ep")
            return x * 2

        region = autoshard.local_map(
            body,
            out_placements=(Shard(0), Replicate()),
            in_placements=((Shard(0), Replicate()),),
            device_mesh=mesh,
        )
        assert region(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]  # plain tensors: fn itself
        assert seen == {"tp": 4, "dp": 2, "idx": 0}


@pytest.fixture
def gloo_mesh1():
    """A one-rank gloo group for one test (conftest's mesh1 would outlive the fake worlds of
    the other tests of this module)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_eager_dtensor_call_goes_through_torchs_local_map(gloo_mesh1):
    """Outside a trace, DTensor arguments are redistributed to in_placements and the result
    wrapped in out_placements (torch's local_map); collectives run on the real group."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    mesh1 = gloo_mesh1

    def body(x):
        return C.all_reduce(x * 3, 0)

    region = autoshard.local_map(
        body,
        out_placements=(Shard(0),),
        in_placements=((Shard(0),),),
        redistribute_inputs=True,
        device_mesh=mesh1,
    )
    x = distribute_tensor(torch.arange(4.0), mesh1, (Replicate(),)).requires_grad_()
    y = region(x)
    assert isinstance(y, DTensor) and y.placements == (Shard(0),)
    assert y.full_tensor().tolist() == [0.0, 3.0, 6.0, 9.0]
    y.sum().backward()
    assert x.grad.full_tensor().tolist() == [3.0] * 4


def test_region_errors_name_the_region():
    with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
        with pytest.raises(ValueError, match="expected 2 placement"):
            autoshard.local_map(
                _softsign,
                out_placements=(Shard(0), Shard(0), Shard(0)),
                in_placements=((Shard(0), Shard(1)),),
                device_mesh=mesh,
            )

        def two(h):
            return h, h * 2

        region = autoshard.local_map(
            two,
            out_placements=(Shard(0), Shard(1)),
            in_placements=((Shard(0), Shard(1)),),
            device_mesh=mesh,
        )
        with torch.device("meta"):
            model = Scaled(region)
        with pytest.raises(Exception, match="two.*declares one output"):
            _plan(model, mesh)
    with fake_world((4,), ("tp",), device_type="cpu") as other:
        region = autoshard.local_map(
            _softsign, out_placements=(Shard(0),), in_placements=((Shard(0),),), device_mesh=other
        )
    with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = Scaled(region)
        with pytest.raises(ValueError, match=r"local_map\(_softsign\), declared on the mesh"):
            _plan(model, mesh)


class SoftsignInForward(nn.Module):
    """Declares its region inside forward, without device_mesh: the mesh is the one of the
    AutoParallel tracing it."""

    def __init__(self, layout):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(32, 32))
        self.layout = layout

    def forward(self, x):
        region = autoshard.local_map(
            _softsign, out_placements=self.layout, in_placements=(self.layout,)
        )
        return region(x @ self.w1).sum()


def test_region_without_device_mesh_takes_the_planning_mesh(monkeypatch):
    from autoshard.placements import layout_to_strs

    layout = (Shard(0), Shard(1))
    # no local_map has named a mesh yet: nothing to fall back on outside a trace
    monkeypatch.setattr(local_map_collectives, "_LAST_MESH", None)
    # declared before any mesh exists (module level / __init__): resolved at the call
    region = autoshard.local_map(_softsign, out_placements=layout, in_placements=(layout,))
    with pytest.raises(ValueError, match="no device_mesh"):
        region(torch.ones(4, 4))
    with fake_world((4,), ("tp",), device_type="cpu") as stale:
        monkeypatch.setattr(local_map_collectives, "_LAST_MESH", stale)  # an older local_map's mesh
    for make in (lambda: Scaled(region), lambda: SoftsignInForward(layout)):
        with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
            with torch.device("meta"):
                model = make()
            _, plan = _plan(model, mesh)
        (fwd,) = [v for k, v in _nodes(plan, "local_map").items() if "backward" not in k]
        assert fwd["inputs"] == [layout_to_strs(layout)]
        assert fwd["outputs"][1] == layout_to_strs(layout)
    # the declaration is kept on the graph node, as AutoParallel's local_map nodes carry it
    with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = Scaled(region)
        with AutoParallel(model, lambda: (torch.empty(32, 32),), mesh) as autop:
            marked = [n for n in autop.gm.graph.nodes if "local_map_kwargs" in n.meta]
        assert len(marked) == 2  # the region and its backward
        assert marked[0].meta["local_map_kwargs"]["device_mesh"] is mesh
        assert marked[0].meta["local_map_kwargs"]["in_placements"] == (layout,)


def test_exported_names():
    from autoshard.ops import local_map as local_map_region

    assert autoshard.local_map is local_map_region.local_map
    for name in (
        "axis_size",
        "axis_index",
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "all_to_all",
        "grad_all_reduce",
    ):
        assert callable(getattr(autoshard.collectives, name))
    assert "local_map" in autoshard.__all__


SCENARIOS = [
    {"name": "tp4", "mesh": [4], "runtime": "program"},
    {"name": "dp2_tp2", "mesh": [2, 2], "runtime": "program"},
    {"name": "tp4_interpreted", "mesh": [4], "runtime": "interpret"},
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun("local_map_worker.py", SCENARIOS, tmp_path_factory.mktemp("lm"), nproc=4)


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_regions_train_like_single_process(results, name):
    for r in ok_on_every_rank(results, name):
        for i, s in enumerate(r["steps"]):
            assert s["loss"] == pytest.approx(s["ref_loss"], rel=1e-5, abs=1e-6), f"step {i}"
            for p, (got, want) in s["params"].items():
                assert torch.allclose(
                    torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6
                ), f"step {i}: parameter {p}"
        planned = r["planned"]
        two_d = len(next(iter(planned.values()))["outputs"][1]) == 2
        # matmul_allreduce: declared inputs, Replicate output on "tp"
        assert planned["local_map"]["inputs"] == (
            [["S(0)", "S(1)"], ["R", "S(0)"]] if two_d else [["S(1)"], ["S(0)"]]
        )
        assert planned["local_map"]["outputs"][1] == (["S(0)", "R"] if two_d else ["R"])
        # all regions ran on local shards through their local twins
        assert r["warnings"].get("local:autoshard.local_map.default", 0) > 0


class DropoutRegion(nn.Module):
    """mm -> a region that draws random numbers (dropout) -> sum."""

    def __init__(self, region):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))
        self.region = region

    def forward(self, x):
        return self.region(x @ self.w).sum()


def _scaled_dropout(h):
    return torch.nn.functional.dropout(h, 0.5, training=True) * 3.0


@pytest.mark.parametrize("runtime", ["program", "interpret", "compile"])
def test_random_region_backward_uses_the_forwards_random_numbers(mesh1, runtime):
    """The backward recomputes the region: from the generator state its forward started
    from, so the gradient is that of the dropout mask the forward applied (one rank, same
    seed: the single-device model's loss and gradient exactly), and the step's later
    random numbers are not shifted by the recomputation."""
    region = autoshard.local_map(
        _scaled_dropout,
        out_placements=(Shard(0),),
        in_placements=((Shard(0),),),
        device_mesh=mesh1,
    )
    torch.manual_seed(0)
    ref, x = DropoutRegion(region), torch.randn(8, 16)
    with torch.device("meta"):
        meta = DropoutRegion(region)
    kwargs = {"compile": True} if runtime == "compile" else {"runtime": runtime}
    with AutoParallel(meta, lambda: (torch.empty(8, 16),), mesh1, **kwargs) as autop:
        autop.add_input_constraints([(Shard(0),)])
        par = autop.apply_placement(autop.optimize_placement())
    par.to_empty(device="cpu")
    par.load_state_dict(ref.state_dict())
    after = []  # a draw from the generator where each step left it
    for model in (par, ref):
        torch.manual_seed(1)
        model(x).backward()
        after.append(torch.rand(3))
    assert torch.equal(par.w.grad.full_tensor(), ref.w.grad)
    assert torch.equal(after[0], after[1])
