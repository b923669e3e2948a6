"""AutoParallel's public names, keywords and return types on autoshard (one process, fake
process group): what a user switching the import relies on. Written from the behaviour
described in AutoParallel's docs, not from its tests."""

import json

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSpec

import autoshard
from autoshard import AutoParallel, _core, auto_parallel
from autoshard.trace.fake_pg import fake_world
from autoshard.api.sharding_optimizer import ShardingOptimizer

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


class Net(nn.Module):
    def __init__(self, pin: bool = False):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)
        self.pin = pin

    def forward(self, x):
        h = self.a(x)
        if self.pin:
            h = autoshard.with_sharding_constraint(h, (Replicate(), Shard(1)))
        return self.b(torch.relu(h))


@pytest.fixture
def mesh22():
    with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
        yield mesh


def _net(pin=False):
    with torch.device("meta"):
        return Net(pin)


def _x():
    return torch.empty(8, 16)


def test_public_names_import():
    from autoshard import (
        AutoParallel,
        ForwardInputs,
        auto_parallel,  # noqa: F401
        autoparallel_backend,
        with_sharding_constraint,
    )

    backend = autoparallel_backend()
    assert callable(backend)
    assert callable(autoparallel_backend(enable_ac=False, overlap_scheduling=True))
    # the plan's recomputation is the compiled program's (test_autoparallel_gaps.py)
    assert callable(autoparallel_backend(enable_ac=True))


def test_constructor_keywords_accepted_or_refused_with_reason(mesh22):
    AutoParallel(_net(), _x, mesh22, None, False, False, "nccl", True)  # AP's positional order
    AutoParallel(
        _net(),
        _x,
        mesh22,
        reshard_after_forward=False,
        dynamic=False,
        cost_model="nccl",
        repeated_subgraphs=False,
    )
    AutoParallel(_net(), _x, mesh22, dynamic=True)  # new input shapes: steps of their own
    with pytest.raises(TypeError, match="dynamic must be True or False"):
        AutoParallel(_net(), _x, mesh22, dynamic="batch")
    with pytest.raises(NotImplementedError, match="reshard_after_forward=False"):
        AutoParallel(_net(), _x, mesh22, reshard_after_forward=True)
    with pytest.raises(ValueError, match="hardware="):
        AutoParallel(_net(), _x, mesh22, cost_model=object())
    with pytest.raises(TypeError, match="dynamic must be True or False"):
        auto_parallel(_net(), mesh22, torch.randn(8, 16), dynamic=1.5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        auto_parallel(_net(), mesh22, torch.randn(8, 16), not_a_keyword=1)


def test_optimize_placement_returns_node_keyed_specs_and_the_plan(mesh22):
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        placement = autop.optimize_placement()
        parallel = autop.apply_placement(placement)
    assert isinstance(placement, dict) and placement
    assert all(isinstance(k, fx.Node) and k.graph is autop.gm.graph for k in placement)
    for node, spec in placement.items():
        assert isinstance(spec, OpSpec)
        specs = spec.output_specs if isinstance(spec.output_specs, tuple) else (spec.output_specs,)
        assert all(s is None or len(s.placements) == 2 for s in specs)
    x = next(
        n
        for n in autop.gm.graph.nodes
        if n.op == "placeholder" and n.name == autop.step.input_nodes[0]
    )
    assert placement[x].output_specs.placements == (Shard(0), Replicate())
    # autoshard's plan JSON stays reachable
    assert placement.plan is autop.plan and set(placement["nodes"]) <= {
        n.name for n in autop.gm.graph.nodes
    }
    assert "summary" in placement and placement.get("summary")["total_us"] > 0
    json.dumps(placement.plan)
    assert isinstance(parallel, Net)
    # readable after the with block, with the AOT descriptors naming the model's own FQNs
    # (as AutoParallel's do), not Dynamo's flattened L__self___a_weight
    assert autop.gm is not None
    assert list(autop.joint_with_descriptors.params_spec) == [
        name for name, _ in _net().named_parameters()
    ]


def test_hand_edited_placement_is_applied(mesh22):
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        placement = autop.optimize_placement()
        w = next(n for n in autop.gm.graph.nodes if autop.step.param_fqns.get(n.name) == "a.weight")
        old = placement[w]
        spec = type(old.output_specs)(
            old.output_specs.mesh,
            (Replicate(), Replicate()),
            tensor_meta=old.output_specs.tensor_meta,
        )
        placement[w] = OpSpec(spec, [spec])
        parallel = autop.apply_placement(placement)
    assert tuple(parallel.a.weight.placements) == (Replicate(), Replicate())


def test_the_node_view_is_built_on_first_use(mesh22):
    """A result handed straight to apply_placement never builds its {node: OpSpec} view (a
    second on a 70B-sized graph); the first dict read builds it."""
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        placement = autop.optimize_placement()
        assert placement._gm is not None  # not built
        assert placement.to_plan() == placement.plan
        assert placement["summary"] and placement._gm is not None  # the JSON view: no build
        nodes = list(placement)
        assert placement._gm is None and len(placement) == len(nodes) > 0
        assert all(isinstance(n, fx.Node) for n in nodes)


def test_sharding_optimizer_constraints_json_and_files(mesh22, tmp_path):
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        opt = autop.sharding_optimizer
        w = next(n for n in autop.gm.graph.nodes if autop.step.param_fqns.get(n.name) == "b.weight")
        names = opt.add_node_constraint(w, (Replicate(), Shard(1)), constraint_name="b_tp")
        assert names == ["b_tp"]
        placement = opt.get_solution()
        assert placement[w].output_specs.placements == (Replicate(), Shard(1))
        info = opt.get_json()
        assert {"nodes", "edges", "mesh"} <= set(info) and any(
            n["name"] == w.name and n["outputs"] == [["R", "S(1)"]] for n in info["nodes"]
        )
        opt.remove_constraints(["b_tp"])
        assert w.name not in autop.options().node_constraints
        opt.save(tmp_path / "opt.json")
        opt.save_placements(tmp_path / "placements.json")
        loaded = opt.load_placements(tmp_path / "placements.json")
        assert loaded[w].output_specs.placements == (Replicate(), Shard(1))
        parallel = autop.apply_placement(loaded)
    assert tuple(parallel.b.weight.placements) == (Replicate(), Shard(1))
    offline = ShardingOptimizer.load(tmp_path / "opt.json")  # no model, no process group
    offline.add_node_constraint(w.name, (Replicate(), Replicate()))
    assert offline.get_solution()["nodes"][w.name]["outputs"] == [["R", "R"]]


def test_diff_solutions_and_explain_placement(mesh22, capsys):
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        opt = autop.sharding_optimizer
        free = opt.get_solution().plan
        # an activation: pinning a parameter also raises its memory share (the budget), so
        # that plan may be cheaper than the free one
        w = next(n for n in autop.gm.graph.nodes if n.target == torch.ops.aten.relu.default)
        opt.add_node_constraint(w, (Replicate(), Replicate()))
        pinned = opt.get_solution()
        diff = opt.diff_solutions(free, pinned)
        # the pinned plan is never cheaper than the free optimum, and the pinned node changed
        # unless the optimum already replicated it
        assert diff["delta_us"]["total_us"] >= -1e-6
        chosen = free["nodes"][w.name]["outputs"][0]
        assert (w.name in diff["changed_nodes"]) == (chosen != ["R", "R"])
        assert "totals (A -> B)" in capsys.readouterr().out
        opt.remove_constraints([f"node_constraint_{w.name}"])
        opt.get_solution()
        rows = opt.explain_placement((Replicate(), Replicate()), max_nodes=4)
    assert rows and {r["status"] for r in rows} <= {
        "CHOSEN",
        "TIE",
        "CHOSEN CHEAPER",
        "TARGET CHEAPER",
        "UNAVAILABLE",
    }
    for r in rows:
        assert (r["status"] == "CHOSEN") == (r["chosen"] == ["R", "R"])
        # an activation pinned elsewhere never beats the proven optimum (a pinned parameter
        # may: its memory share is raised to what the pin needs)
        if r["status"] == "TARGET CHEAPER":
            assert r["node"] in autop.step.param_fqns, r
    assert "status" in capsys.readouterr().out


def test_print_costs_for_node(mesh22, capsys):
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        autop.optimize_placement()
        mm = next(n for n in autop.gm.graph.nodes if n.target == torch.ops.aten.mm.default)
        m = autop.sharding_optimizer.print_costs_for_node(mm, arg=0)
        with pytest.raises(ValueError, match="out of range"):
            autop.sharding_optimizer.print_costs_for_node(mm, arg=7)
    assert m["rows"] and m["cols"] and len(m["costs_us"]) == len(m["rows"])
    assert all(len(r) == len(m["cols"]) for r in m["costs_us"])
    # staying in the same layout is free; a gather (S -> R) costs something
    pairs = [
        (row, col, c)
        for row, costs in zip(m["rows"], m["costs_us"])
        for col, c in zip(m["cols"], costs)
    ]
    assert all(c == 0 for row, col, c in pairs if row == col)
    assert any(c > 0 for row, col, c in pairs if "S(0)" in col and row == ["R", "R"])
    assert m["producer"] in capsys.readouterr().out


def test_add_node_constraint_defaults_to_batch_sharding(mesh22):
    with AutoParallel(_net(), _x, mesh22) as autop:
        mm = next(n for n in autop.gm.graph.nodes if n.op == "call_function")
        autop.add_node_constraint(mm)
        assert autop.options().node_constraints[mm.name] == ["S(0)", "R"]
        with pytest.raises(ValueError, match="no node named"):
            autop.add_node_constraint("no_such_node", (Replicate(), Replicate()))


class MaxNet(Net):
    def forward(self, x):
        values, idx = self.a(x).max(dim=-1)
        return values.sum() + idx.float().sum()


def test_node_constraint_on_an_ops_output_pins_the_op_or_says_why_not(mesh22):
    """The planner has no getitem nodes: a pin of an op's first output pins the op; a pin
    of another output is refused when it is added, naming what to pin instead."""
    import operator

    with torch.device("meta"):
        net = MaxNet()
    with AutoParallel(net, _x, mesh22) as autop:
        gets = [
            n
            for n in autop.gm.graph.nodes
            if n.target is operator.getitem and str(n.args[0].target) == "aten.max.dim"
        ]
        first, second = sorted(gets, key=lambda n: n.args[1])
        autop.add_node_constraint(first, (Shard(0), Replicate()))
        assert autop.options().node_constraints == {first.args[0].name: ["S(0)", "R"]}
        with pytest.raises(ValueError, match=f"output 1 of '{second.args[0].name}'"):
            autop.add_node_constraint(second, (Shard(0), Replicate()))
        placement = autop.optimize_placement()
    assert placement[first.args[0]].output_specs[0].placements == (Shard(0), Replicate())


def test_with_sharding_constraint_pins_the_node_and_its_gradient(mesh22):
    with AutoParallel(_net(pin=True), _x, mesh22) as autop:
        pins = autop.step.sharding_pins
        assert len(pins) == 2  # forward value and its gradient
        for layout, where in pins.values():
            assert layout == ["R", "S(1)"] and "test_autoparallel_parity.py" in where
        placement = autop.optimize_placement()
    for name in pins:
        node = next(n for n in autop.gm.graph.nodes if n.name == name)
        assert node.target is torch.ops.aten.clone.default
        assert placement[node].output_specs.placements == (Replicate(), Shard(1))


def test_sharding_constraint_with_wrong_mesh_rank_names_the_line(mesh22):
    class Bad(Net):
        def forward(self, x):
            return autoshard.with_sharding_constraint(self.a(x), (Shard(0),)).sum()

    with torch.device("meta"):
        bad = Bad()
    with pytest.raises(ValueError, match=r"1 placements .* 2-d mesh"):
        with AutoParallel(bad, _x, mesh22):
            pass


def test_eager_with_sharding_constraint_is_identity():
    x = torch.randn(4, 4, requires_grad=True)
    y = autoshard.with_sharding_constraint(x, (Shard(0),))
    assert torch.equal(y, x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(4, 4))


def test_complex_rotary_ops_have_rules(mesh22):
    class Rope(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(8, 8, bias=False)
            # precomputed, as Llama-3's freqs_cis (torch.polar itself has no rule yet)
            self.register_buffer("table", torch.polar(torch.ones(4), torch.arange(4.0)))

        def forward(self, x):
            h = self.w(x)
            c = torch.view_as_complex(h.reshape(*h.shape[:-1], -1, 2))
            return torch.view_as_real(c * self.table).flatten(-2).sum()

    with torch.device("meta"):
        model = Rope()
    with AutoParallel(model, lambda: torch.empty(4, 6, 8), mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        placement = autop.optimize_placement()
    ops = {str(n.target) for n in placement}
    assert {
        "aten.view_as_complex.default",
        "aten.view_as_real.default",
        "aten._conj.default",
    } <= ops


def test_parallel_gm_before_and_after_materialising(mesh22):
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        parallel = autop.apply_placement(autop.optimize_placement())
    # readable at once (lowered from the meta state), as AutoParallel's
    before = autop.parallel_gm
    assert isinstance(before, fx.GraphModule)
    assert any(n.target == torch.ops.aten.mm.default for n in before.graph.nodes)
    assert all(p.device.type == "meta" for p in parallel.parameters())
    parallel.to_empty(device="cpu")
    after = autop.parallel_gm
    assert isinstance(after, fx.GraphModule) and after is not before
    assert all(isinstance(p, DTensor) for p in parallel.parameters())


def test_parallel_gm_carries_user_annotations(mesh22):
    import torch.fx.traceback as fx_traceback

    class Annotated(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 16, bias=False)
            self.b = nn.Linear(16, 16, bias=False)

        def forward(self, x):
            with fx_traceback.annotate({"stage": "first"}):
                h = self.a(x)
            with fx_traceback.annotate({"stage": "second"}):
                return self.b(h)

    with torch.device("meta"):
        model = Annotated()
    with fx_traceback.preserve_node_meta(), AutoParallel(model, _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        autop.add_output_constraints([(Shard(0), Replicate())])
        parallel = autop.apply_placement(autop.optimize_placement())
    joint = autop.parallel_gm  # forward + backward, as AutoParallel's
    mms = [n for n in joint.graph.nodes if n.target == torch.ops.aten.mm.default]
    fwd = [n.meta["custom"].get("stage") for n in mms if "partitioner_tag" not in n.meta]
    bwd = [
        n.meta["custom"].get("stage") for n in mms if n.meta.get("partitioner_tag") == "is_backward"
    ]
    assert fwd == ["first", "second"]
    assert set(bwd) == {"first", "second"}
    assert [
        n.meta["custom"].get("stage")
        for n in parallel.parallel_bwd_gm.graph.nodes
        if n.target == torch.ops.aten.mm.default
    ] == bwd


def test_parallel_gm_is_the_joint_of_the_graphs_the_module_runs(mesh22):
    """autop.parallel_gm: the forward's placeholders, a tangent per module output, the
    forward's nodes, the backward's (tagged), outputs = module outputs then gradients."""
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        parallel = autop.apply_placement(autop.optimize_placement())
    joint = autop.parallel_gm
    fwd, bwd = parallel.parallel_gm, parallel.parallel_bwd_gm

    def calls(gm):
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    nodes = [n for n in joint.graph.nodes if n.op == "call_function"]
    tagged = [n for n in nodes if n.meta.get("partitioner_tag") == "is_backward"]
    assert [str(n.target) for n in nodes if n not in tagged] == calls(fwd)
    assert [str(n.target) for n in tagged] == calls(bwd)
    placeholders = [n.name for n in joint.graph.nodes if n.op == "placeholder"]
    n_fwd_in = sum(n.op == "placeholder" for n in fwd.graph.nodes)
    # named as AOTAutograd names a joint graph's inputs; the Net has one output
    assert placeholders == [f"primals_{k + 1}" for k in range(n_fwd_in)] + ["tangents_1"]
    outs = joint.graph.output_node().args[0]
    assert len(outs) == 1 + len(bwd.graph.output_node().args[0])
    assert all("custom" not in n.meta for n in joint.graph.nodes if n.op == "placeholder")


def test_parallel_gm_without_gradients_is_the_forward_alone(mesh22):
    """Nothing requires grad (inference): no tangents and no backward nodes, as AutoParallel's."""
    model = _net()
    for p in model.parameters():
        p.requires_grad_(False)
    with AutoParallel(model, _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        parallel = autop.apply_placement(autop.optimize_placement())
    joint = autop.parallel_gm
    n_inputs = sum(n.op == "placeholder" for n in parallel.parallel_gm.graph.nodes)
    assert [n.name for n in joint.graph.nodes if n.op == "placeholder"] == [
        f"primals_{k + 1}" for k in range(n_inputs)
    ]
    assert not any(n.meta.get("partitioner_tag") == "is_backward" for n in joint.graph.nodes)


def test_sharding_optimizer_graph_and_named_constraints(mesh22):
    from torch._functorch._aot_autograd.fx_utils import get_param_nodes

    with AutoParallel(_net(), _x, mesh22) as autop:
        opt = autop.sharding_optimizer
        assert opt.graph is autop.gm.graph
        params = get_param_nodes(opt.graph)
        assert len(params) == 4 and opt._concrete_to_orig.get(params[0], params[0]) is params[0]
        autop.add_input_constraints([(Shard(0), Replicate())])
        autop.add_parameter_memory_constraint(low=None, high=None)
        assert {"memory_constraint_high", "memory_constraint_low"} <= set(opt.prob.constraints)
        names = opt.add_node_constraint(params[0], (Replicate(), Replicate()))
        assert set(names) <= set(opt.prob.constraints)
        solution = opt.resolve()
        assert solution[params[0]].output_specs.placements == (Replicate(), Replicate())
        opt.remove_constraints(names + ["memory_constraint_high", "memory_constraint_low"])
        assert not set(opt.prob.constraints) & {
            *names,
            "memory_constraint_high",
            "memory_constraint_low",
        }
        opt.resolve()
    # reading still works after the block; planning again does not
    assert opt.graph is autop.gm.graph and isinstance(opt.prob.constraints, dict)
    with pytest.raises(RuntimeError, match="not reentrant"):
        opt.resolve()


def test_strats_lists_every_candidate_layout_including_uneven_shards():
    from torch._functorch._aot_autograd.fx_utils import get_param_nodes
    from torch.distributed.tensor._op_schema import OpStrategy

    class Odd(nn.Module):  # weight [12, 10]: 10 does not divide by the tp size 4
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(10, 12, bias=False)

        def forward(self, x):
            return self.w(x)

    with fake_world((2, 4), ("dp", "tp"), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = Odd()
        with AutoParallel(model, lambda: torch.empty(8, 10), mesh) as autop:
            autop.add_input_constraints([(Shard(0), Replicate())])
            chosen = autop.optimize_placement()
            strats = autop.sharding_optimizer.strats
            assert autop.sharding_optimizer.strats is strats  # built once
    weight = get_param_nodes(autop.gm.graph)[0]
    assert isinstance(strats[weight], OpStrategy)
    layouts = {tuple(s.output_specs.placements) for s in strats[weight].strategies}
    assert (Replicate(), Shard(1)) in layouts and (Replicate(), Shard(0)) in layouts
    assert tuple(chosen[weight].output_specs.placements) in layouts
    mm = next(n for n in autop.gm.graph.nodes if n.target == torch.ops.aten.mm.default)
    for s in strats[mm].strategies:  # an op's strategies carry its input layouts too
        assert len(s.input_specs) == 2 and s.output_specs.mesh is mesh
        assert s.input_specs[0].tensor_meta.shape == mm.args[0].meta["val"].shape


def test_failed_enter_leaves_autoparallel_unentered(mesh22, monkeypatch):
    import autoshard.api.autoparallel

    def broken(_autop):
        raise RuntimeError("optimizer construction failed")

    monkeypatch.setattr(autoshard.api.autoparallel, "ShardingOptimizer", broken)
    autop = AutoParallel(_net(), _x, mesh22)
    with pytest.raises(RuntimeError, match="optimizer construction failed"):
        autop.__enter__()
    with pytest.raises(RuntimeError, match="context manager"):
        autop.sharding_optimizer
    monkeypatch.undo()
    with AutoParallel(_net(), _x, mesh22) as again:  # nothing left behind
        assert again.sharding_optimizer is not None


def test_autop_model_is_a_fake_copy_keeping_aliases(mesh22):
    from torch._subclasses import FakeTensor

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(16, 16, bias=False)
            self.head = nn.Linear(16, 16, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("scale", torch.ones(16))

        def forward(self, x):
            return self.head(self.embed(x)) * self.scale

    model = Tied()  # real CPU weights: the copy must not touch them
    autop = AutoParallel(model, _x, mesh22)
    fake = autop.model
    assert fake is autop.model and fake is not model
    assert isinstance(fake.get_parameter("embed.weight"), FakeTensor)
    assert isinstance(fake.get_buffer("scale"), FakeTensor)
    assert fake.head.weight is fake.embed.weight
    assert isinstance(fake.embed.weight, nn.Parameter) and fake.embed.weight.requires_grad
    assert not isinstance(model.embed.weight, FakeTensor)
    with autop:  # traces the model that was passed
        autop.add_input_constraints([(Shard(0), Replicate())])
        autop.optimize_placement()


def test_aliased_submodules_stay_aliased(mesh22):
    class WithEma(nn.Module):
        def __init__(self):
            super().__init__()
            self.student = nn.Linear(16, 16)
            self.teacher = nn.Linear(16, 16)
            self.ema = self.teacher  # one module under two names

        def forward(self, x):
            return self.student(x) + self.teacher(x)

    with torch.device("meta"):
        model = WithEma()
    with AutoParallel(model, _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        parallel = autop.apply_placement(autop.optimize_placement())
    assert parallel.ema is parallel.teacher and parallel.ema.weight is parallel.teacher.weight
    names = dict(parallel.named_parameters(remove_duplicate=False))
    assert "ema.weight" in names and "teacher.weight" in names


def test_joint_with_descriptors_holds_the_parallel_graph_after_apply_placement(mesh22):
    """As AutoParallel swaps the parallel graph into it: before apply_placement the traced
    joint, after it the lowered step, with the trace's descriptors still readable."""
    with AutoParallel(_net(), _x, mesh22) as autop:
        autop.add_input_constraints([(Shard(0), Replicate())])
        assert autop.joint_with_descriptors.graph_module is autop.gm
        autop.apply_placement(autop.optimize_placement())
    joint = autop.joint_with_descriptors
    lowered = joint.graph_module
    assert lowered is not autop.gm
    assert [n.name for n in lowered.graph.nodes if n.op == "placeholder"] == [
        n.name for n in autop.parallel_gm.graph.nodes if n.op == "placeholder"
    ]
    assert list(joint.params_spec) == [n for n, _ in _net().named_parameters()]
