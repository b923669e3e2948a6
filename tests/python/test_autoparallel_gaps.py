"""The last gaps a user switching from AutoParallel hits (issue 45), one process, fake
process group: local_map's output structure in a traced model, the sharding optimizer's
files after the ``with`` block, the input errors' exception type, get_json's summary keys,
how a with_sharding_constraint is found in the graph, AutoParallel's activation-checkpointing
keywords routed to the planner's recomputation, and local_map imported from
autoshard.collectives. Written from the behaviour
AutoParallel documents, not from its tests."""

import functools

import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard

import autoshard
from autoshard import AutoParallel, _core
from autoshard.trace.fake_pg import fake_world

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


@pytest.fixture
def mesh4():
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        yield mesh


# ---- 1. local_map returns what fn returns ---------------------------------------------------
def _doubled(h):
    return h * 2


def _doubled_in_a_tuple(h):
    return (h * 2,)


class RegionThenMatmul(nn.Module):
    """The region's result goes straight into the next op (unpacked first where fn returns a
    1-tuple), so a result in another structure than fn's fails the trace."""

    def __init__(self, region, unpack: bool):
        super().__init__()
        self.w = nn.Parameter(torch.empty(16, 16))
        self.region = region
        self.unpack = unpack

    def forward(self, x):
        out = self.region(x @ self.w)
        if self.unpack:
            (out,) = out
        return (out @ self.w).sum()


@pytest.mark.parametrize(
    "fn,returned",
    [(_doubled, "tensor"), (_doubled_in_a_tuple, "tuple")],
)
def test_traced_local_map_returns_the_structure_fn_returns(mesh4, fn, returned):
    # out_placements as a tuple holding one output's placements: torch's local_map returns
    # fn's own structure with it (a bare tensor for a bare tensor), so does the trace
    region = autoshard.local_map(
        fn, out_placements=((Shard(0),),), in_placements=((Shard(0),),), device_mesh=mesh4
    )
    with torch.device("meta"):
        model = RegionThenMatmul(region, unpack=returned == "tuple")
    with AutoParallel(model, lambda: (torch.empty(8, 16),), mesh4) as autop:
        autop.optimize_placement()
    assert any("local_map_kwargs" in n.meta for n in autop.gm.graph.nodes)


# ---- 2. the sharding optimizer's files after the with block --------------------------------
class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _two_linear():
    with torch.device("meta"):
        return TwoLinear()


def test_sharding_optimizer_saves_and_loads_after_the_with_block(mesh4, tmp_path):
    from autoshard.api.sharding_optimizer import ShardingOptimizer

    with AutoParallel(_two_linear(), lambda: (torch.empty(8, 16),), mesh4) as autop:
        chosen = autop.optimize_placement()
    opt = autop.sharding_optimizer
    # the documented workflow: plan, then keep the plan in a file
    opt.save(tmp_path / "opt.json")
    opt.save_placements(tmp_path / "placements.json")
    loaded = opt.load_placements(tmp_path / "placements.json")
    assert set(loaded) == set(chosen)
    node = next(iter(chosen))
    assert loaded[node].output_specs.placements == chosen[node].output_specs.placements
    assert {n["name"] for n in opt.get_json()["nodes"]} >= {n.name for n in chosen}
    offline = ShardingOptimizer.load(tmp_path / "opt.json")
    assert offline.get_solution()["nodes"].keys() == chosen.plan["nodes"].keys()
    # planning again with this AutoParallel still needs its block
    with pytest.raises(RuntimeError, match="not reentrant"):
        opt.resolve()


# ---- 3. a wrong number of arguments: both ValueError (AutoParallel's) and TypeError ---------
@pytest.fixture
def gloo_mesh1():
    """A one-rank gloo group for one test (conftest's module-wide mesh1 would overlap the
    fake process groups of the other tests here)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x, target):
        return ((self.lin(x) - target) ** 2).mean()


def _parallel_loss(mesh):
    from autoshard.runtime.parallel_module import build_parallel_module
    from autoshard.trace.tracer import trace_training_step

    with torch.device("meta"):
        meta = Loss()
    example = lambda: (torch.empty(4, 6), torch.empty(4, 6))  # noqa: E731
    step = trace_training_step(meta, example, capture="direct")
    par = build_parallel_module(meta, step, {"nodes": {}}, mesh)
    par.to_empty(device="cpu")
    return par


@pytest.mark.parametrize(
    "args,kwargs,what",
    [
        ((3,), {}, "too many positional arguments"),
        ((1,), {}, "missing a required argument: 'target'"),
        ((2,), {"scale": 1.0}, "unexpected keyword argument 'scale'"),
    ],
)
def test_wrong_arguments_raise_both_valueerror_and_typeerror(gloo_mesh1, args, kwargs, what):
    par = _parallel_loss(gloo_mesh1)
    x = torch.zeros(4, 6)
    call = lambda: par(*[x] * args[0], **kwargs)  # noqa: E731
    # AutoParallel's users catch ValueError, Python's habit is TypeError: both work, and
    # the message says what was wrong and how many arguments the traced call had
    for caught in (ValueError, TypeError):
        with pytest.raises(caught, match=what) as err:
            call()
        assert "expected the 2 argument(s) it was traced with: x, target" in str(err.value)


# ---- 4. get_json's summary has AutoParallel's keys too ------------------------------------
def test_get_json_summary_has_autoparallels_keys_in_microseconds(mesh4):
    with AutoParallel(_two_linear(), lambda: (torch.empty(8, 16),), mesh4) as autop:
        autop.optimize_placement()
        info = autop.sharding_optimizer.get_json()
    summary = info["summary"]
    # autoshard's own keys stay
    assert {"total_us", "compute_us", "comm_us"} <= set(summary)
    # AutoParallel's: the same microseconds, total = the sum of the parts (as it defines it)
    assert summary["compute"] == pytest.approx(summary["compute_us"])
    assert summary["comm"] == pytest.approx(summary["comm_us"])
    assert summary["transition"] == 0.0
    assert summary["total"] == pytest.approx(summary["compute"] + summary["comm"])
    assert summary["compute"] == pytest.approx(sum(n["compute_us"] for n in info["nodes"]))
    assert summary["compute"] > 0


# ---- 5. a with_sharding_constraint is found as AutoParallel's users find theirs ------------
class PinnedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 16)

    def forward(self, x):
        h = autoshard.with_sharding_constraint(self.a(x), (Replicate(), Shard(1)))
        h = autoshard.with_sharding_constraint(self.b(h), (Shard(0), Replicate()))
        return self.c(h)


def _declared_nodes(graph, backward: bool) -> list:
    """The lookup AutoParallel's users write: nodes declaring a local_map region (its
    with_sharding_constraint is one), split by the partitioner's backward tag."""
    return [
        n
        for n in graph.nodes
        if "local_map_kwargs" in n.meta
        and (n.meta.get("partitioner_tag") == "is_backward") == backward
    ]


def test_sharding_constraint_node_is_found_by_its_local_map_kwargs():
    pins = [(Replicate(), Shard(1)), (Shard(0), Replicate())]
    with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = PinnedTwice()
        with AutoParallel(model, lambda: (torch.empty(8, 16),), mesh) as autop:
            placement = autop.optimize_placement()
    forward = _declared_nodes(autop.gm.graph, backward=False)
    assert len(forward) == 2  # one per constraint, in the model's order
    for node, pin in zip(forward, pins):
        assert placement[node].output_specs.placements == pin
        declared = node.meta["local_map_kwargs"]
        assert declared["out_placements"] == pin and declared["in_placements"] == (pin,)
        assert declared["device_mesh"] is mesh
    # the gradient is pinned too, on the backward's node
    backward = _declared_nodes(autop.gm.graph, backward=True)
    assert {placement[n].output_specs.placements for n in backward} == set(pins)
    assert len(backward) == 2


# ---- 6. activation checkpointing: AutoParallel's keywords reach the planner's recompute -----
def _tiny_linear():
    return nn.Linear(16, 16)


@pytest.mark.parametrize(
    "enable_ac,recompute,planned",
    [
        (True, None, "auto"),  # AC wherever the memory limit needs it
        (False, None, "none"),
        (None, None, None),  # neither: the planner's default ("auto")
        (None, "selective", "selective"),
        (True, "full", "full"),  # AC in every block: enable_ac=True all the more
        (False, "none", "none"),
    ],
)
def test_enable_ac_sets_the_planners_recompute_mode(mesh4, enable_ac, recompute, planned):
    autop = AutoParallel(
        _tiny_linear(), lambda: torch.empty(8, 16), mesh4, enable_ac=enable_ac, recompute=recompute
    )
    assert autop.recompute == planned
    assert autop.options().recompute == planned


@pytest.mark.parametrize(
    "keywords,error,named",
    [
        ({"enable_ac": True, "recompute": "none"}, ValueError, "recompute='none'"),
        ({"enable_ac": False, "recompute": "selective"}, ValueError, "recompute='selective'"),
        ({"enable_ac": "yes"}, TypeError, "enable_ac must be True, False or None"),
        ({"recompute": "everything"}, ValueError, "'selective', 'full'"),
        ({"ac_stage_size_in_GiB": 2.0}, NotImplementedError, "memory_limit_bytes="),
    ],
)
def test_activation_checkpointing_keywords_that_cannot_be_honoured_are_refused(
    mesh4, keywords, error, named
):
    with pytest.raises(error) as err:
        AutoParallel(_tiny_linear(), lambda: torch.empty(8, 16), mesh4, **keywords)
    assert named in str(err.value)


def test_auto_parallel_takes_the_activation_checkpointing_keywords(mesh4):
    # refused before tracing, so the one-call form reports the same stage-size message
    with pytest.raises(NotImplementedError, match="ac_stage_size_in_GiB=1.5"):
        autoshard.auto_parallel(_tiny_linear(), mesh4, torch.empty(8, 16), ac_stage_size_in_GiB=1.5)
    with pytest.raises(ValueError, match="contradict"):
        autoshard.auto_parallel(
            _tiny_linear(), mesh4, torch.empty(8, 16), enable_ac=False, recompute="full"
        )


def test_enable_ac_under_a_tight_memory_limit_plans_recomputation_and_false_none(mesh4):
    """At 5 MiB a rank the small Llama's step does not fit without recomputation: with
    enable_ac=True the planner recomputes part of the forward and fits; with False it
    recomputes nothing and says the plan does not fit."""
    from autoshard._testing.models_zoo import llama3_memory

    with torch.device("meta"):
        model = llama3_memory()
    tokens = lambda: (torch.zeros(8, 64, dtype=torch.long),) * 2  # noqa: E731
    plans = {}
    for enable_ac in (True, False):
        with AutoParallel(
            model,
            tokens,
            mesh4,
            hardware="CPU",
            memory_limit_bytes=5 << 20,
            enable_ac=enable_ac,
            plan_cache=False,
        ) as autop:
            autop.add_input_constraints([(Shard(0),), (Shard(0),)])
            plans[enable_ac] = autop.optimize_placement().plan
    checkpointed = plans[True]["summary"]["recompute"]
    assert plans[True]["recompute"] and checkpointed["fits"]
    assert set(checkpointed["blocks"].values()) - {"none"}
    assert plans[False]["recompute"] == [] and not plans[False]["summary"]["recompute"]["fits"]


def test_autoparallel_backend_takes_enable_ac_and_says_where_recomputation_is_set(caplog):
    from autoshard import autoparallel_backend

    for enable_ac in (True, False):
        with caplog.at_level("INFO", logger="autoshard"):
            assert callable(autoparallel_backend(enable_ac=enable_ac))
        assert f"enable_ac={enable_ac}" in caplog.text and "recompute=" in caplog.text
        caplog.clear()
    with pytest.raises(NotImplementedError) as err:
        autoparallel_backend(ac_stage_size_in_GiB=2.0)
    message = str(err.value)
    assert "memory_limit_bytes=" in message and "recompute=" in message
    with pytest.raises(TypeError, match="enable_ac must be"):
        autoparallel_backend(enable_ac=1.0)


class CheckpointedBlock(nn.Module):
    """The first linear + relu under the model's own torch.utils.checkpoint, with a policy
    that saves matmuls and recomputes the rest; the second linear outside it."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(16, 16)
        self.outer = nn.Linear(16, 16)

    def _checkpointed_region(self, x):
        return torch.relu(self.inner(x))

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        # a partial, as torch documents it: Dynamo does not trace a lambda context_fn
        context = functools.partial(create_selective_checkpoint_contexts, _save_matmuls_policy)
        h = checkpoint(self._checkpointed_region, x, use_reentrant=False, context_fn=context)
        return self.outer(h)


def _save_matmuls_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE


def test_parallel_gm_keeps_each_traced_nodes_source_and_checkpoint_tags(mesh4):
    """autop.parallel_gm's nodes carry their traced node's stack_trace, module stack, seq_nr
    and the model's checkpoint tags, as AutoParallel's parallel graph does; a collective
    carries those of the one traced node it moves a value for, a bucket of several none."""
    with torch.device("meta"):
        model = CheckpointedBlock()
    with AutoParallel(model, lambda: torch.empty(8, 16), mesh4, plan_cache=False) as autop:
        autop.add_input_constraints([(Shard(0),)])
        autop.apply_placement(autop.optimize_placement())
    traced = {n.name: n for n in autop.gm.graph.nodes}
    lowered = list(autop.parallel_gm.graph.nodes)

    def source(node):
        return traced.get((node.meta.get("custom") or {}).get("autoshard_node"))

    in_region = [n for n in lowered if "_checkpointed_region" in n.meta.get("stack_trace", "")]
    forward = [n for n in in_region if n.meta.get("partitioner_tag") != "is_backward"]
    assert forward, "no lowered forward node names the checkpointed function"
    for node in forward:
        assert node.meta.get("recompute") == source(node).meta.get("recompute"), node
    assert {n.meta["recompute"] for n in forward if "recompute" in n.meta} >= {
        torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE
    }
    assert any(n.meta.get("nn_module_stack") for n in lowered)
    # a backward node pairs with a forward node through autograd's seq_nr
    backward = [n for n in lowered if n.meta.get("partitioner_tag") == "is_backward"]
    forward_seq = {n.meta.get("seq_nr") for n in lowered if n not in backward} - {None}
    assert any(n.meta.get("seq_nr") in forward_seq for n in backward)
    # a collective moving one traced node's value shows that node's source; a bucket
    # gathering several nodes' values names none, so it carries no source
    collectives = [n for n in lowered if "_c10d_functional" in str(n.target)]
    for node in collectives:
        if source(node) is None:
            assert "stack_trace" not in node.meta, node
        else:
            assert node.meta.get("stack_trace") == source(node).meta.get("stack_trace")
    assert any(source(n) is None for n in collectives)


# ---- 7. local_map where AutoParallel users import it from: the collectives module -----------
def test_local_map_is_importable_from_collectives_and_traces_as_a_decorator(mesh4):
    from autoshard import collectives
    from autoshard.collectives import local_map

    assert local_map is autoshard.local_map
    assert "local_map" in collectives.__all__ and "axis_size" in collectives.__all__

    class DecoratedRegion(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.empty(16, 16))

        def forward(self, x):
            # the decorator form, no device_mesh: the region takes the AutoParallel's mesh
            @local_map(out_placements=((Shard(0),),), in_placements=((Shard(0),),))
            def scaled(h):
                return (h * 3,)

            return (scaled(x @ self.w)[0] @ self.w).sum()

    with torch.device("meta"):
        model = DecoratedRegion()
    with AutoParallel(model, lambda: (torch.empty(8, 16),), mesh4) as autop:
        autop.optimize_placement()
    assert sum("local_map_kwargs" in n.meta for n in autop.gm.graph.nodes) >= 1
