"""User sharding rules (python/autoshard/user_rules.py): a custom op with a rule registered
through register_sharding (autoshard's or torch's) plans on fake meshes of 8 and 2x4 ranks
with one of the user's strategies, runs on 2 gloo ranks like the single-process model, and
bad rules or a missing one give errors naming the op and the fix."""

import json

import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard

import autoshard
from autoshard import AutoParallel, _core
from autoshard.ops import user_rules
from autoshard.trace.fake_pg import fake_world
from conftest import ok_on_every_rank, run_torchrun
from user_rule_ops import RowScaleMLP, rowscale_backward_rule, rowscale_rule

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

aten = torch.ops.aten


def _plan(mesh, model, batch: int, dim: int, pins=()):
    """Graph JSON and plan of ``model`` with its inputs batch-sharded on every mesh dim."""
    lay = (Shard(0),) * mesh.ndim
    with AutoParallel(
        model, lambda: (torch.empty(batch, dim), torch.empty(batch, dim)), mesh
    ) as autop:
        autop.add_input_constraints([lay, lay])
        for name in pins:
            autop.add_node_constraint(name, lay)
        graph = json.loads(autop.graph_json())
        return graph, autop.optimize_placement().plan


def _user_rows(graph: dict, node: str) -> set:
    (entry,) = [n for n in graph["nodes"] if n["name"] == node]
    return {(tuple(r["outputs"]), tuple(r["inputs"])) for r in entry["strategies"]}


def _per_mesh_dim(planned: dict, mesh_ndim: int) -> list:
    """The planned layouts of a node cut into one (outputs, inputs) row per mesh dim."""
    return [
        (tuple(o[i] for o in planned["outputs"]), tuple(a[i] for a in planned["inputs"]))
        for i in range(mesh_ndim)
    ]


def test_register_sharding_is_exported_and_wraps_torchs():
    assert autoshard.register_sharding is user_rules.register_sharding
    assert "user rule" in autoshard.register_sharding.__doc__
    # both registration paths are found: autoshard's decorator and torch's own
    assert user_rules.user_rule_of(torch.ops.mylib.rowscale.default) is rowscale_rule
    assert (
        user_rules.user_rule_of(torch.ops.mylib.rowscale_backward.default) is rowscale_backward_rule
    )
    assert user_rules.user_rule_of(aten.mm.default) is None  # DTensor's built-in rule


@pytest.mark.parametrize("shape", [(8,), (2, 4)])
def test_custom_op_plans_with_a_user_strategy(shape):
    with fake_world(shape, device_type="cpu") as mesh:
        with torch.device("meta"):
            model = RowScaleMLP(1024, 1024)  # large enough that batch sharding pays
        graph, plan = _plan(mesh, model, 4096, 1024)
    assert _user_rows(graph, "rowscale") == {(("R",), ("R", "R")), (("S(0)",), ("S(0)", "R"))}
    assert _user_rows(graph, "rowscale_backward") == {
        (("R", "R"), ("R", "R", "R")),
        (("S(0)", "P(sum)"), ("S(0)", "S(0)", "R")),
    }
    for node in ("rowscale", "rowscale_backward"):
        planned = plan["nodes"][node]
        assert planned["strategies"] == 2 ** len(shape)  # the rows' product over mesh dims
        for row in _per_mesh_dim(planned, len(shape)):
            assert row in _user_rows(graph, node), f"{node}: {planned}"
    # the batch stays sharded through the row-wise op (no gather of the activations)
    assert plan["nodes"]["rowscale"]["outputs"] == [["S(0)"] * len(shape)]
    assert plan["nodes"]["rowscale_backward"]["outputs"][1] == ["P(sum)"] * len(shape)


class Tril(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x, target):
        return ((torch.tril(x @ self.w) - target) ** 2).sum()


def test_user_rule_wins_over_the_cpp_rule(monkeypatch):
    # aten.tril has a C++ rule (replicate only); a user rule sharding the batch dim replaces
    # it. DTensor's registries are restored afterwards, so no other test sees the rule.
    prop = DTensor._op_dispatcher.sharding_propagator
    for table in (prop.op_strategy_funcs, prop.op_to_schema_info):
        monkeypatch.setitem(table, aten.tril.default, table.get(aten.tril.default))
    monkeypatch.setattr(user_rules, "_REGISTERED", {})

    @autoshard.register_sharding(aten.tril.default)
    def tril_rule(x, diagonal=0):
        return [([Replicate()], [Replicate(), None]), ([Shard(0)], [Shard(0), None])]

    with fake_world((4,), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = Tril()
        with AutoParallel(
            model, lambda: (torch.empty(8, 8, 8), torch.empty(8, 8, 8)), mesh
        ) as autop:
            graph = autop.graph_json()
    strategies = json.loads(_core.enumerate_strategies(graph, json.dumps({"mesh": {"shape": [4]}})))
    trils = [n["name"] for n in json.loads(graph)["nodes"] if n["op"] == "aten.tril.default"]
    assert trils  # forward and backward
    for name in trils:
        got = {
            (tuple(o[0] for o in s["outputs"]), tuple(i[0] for i in s["inputs"]))
            for s in strategies["nodes"][name]
        }
        assert got == {(("R",), ("R",)), (("S(0)",), ("S(0)",))}


# A third custom op whose rule is switched per test to each kind of mistake.
_BAD = {"rows": None}


@torch.library.custom_op("mylib::badrule", mutates_args=())
def badrule(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@badrule.register_fake
def _(x, w):
    return torch.empty_like(x)


def _grad_x_only(ctx, grad):
    return grad, None


def _no_context(ctx, inputs, output):
    pass


badrule.register_autograd(_grad_x_only, setup_context=_no_context)


@autoshard.register_sharding(torch.ops.mylib.badrule.default)
def bad_rule(x, w):
    if isinstance(_BAD["rows"], Exception):
        raise _BAD["rows"]
    return _BAD["rows"]


class BadModel(nn.Module):
    def __init__(self, op: str):
        super().__init__()
        self.op = op  # a name: the model is deep-copied, and custom op objects cannot be
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x, target):
        op = badrule if self.op == "badrule" else norule
        return ((op(x, self.w) - target) ** 2).sum()


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [([Shard(0)], [Shard(0)])],
            r"strategy 0 for node 'badrule' \(mylib.badrule.default.*\): 1 input placement\(s\) that "
            r"are not None, but the op is called with 2 tensor\(s\)",
        ),
        (
            [([Replicate()], [Replicate(), Replicate()]), ([Shard(2)], [Shard(2), Replicate()])],
            r"bad_rule registered for mylib.badrule.default, strategy 1 .*: output 0: Shard\(2\) is out "
            r"of range for a tensor with 2 dim\(s\) \(shape \[4, 8\]\)",
        ),
        (
            [([Replicate(), Replicate()], [Replicate(), Replicate()])],
            r"2 output placement\(s\), but the op returns 1 value",
        ),
        ([], r"returned no strategy for node 'badrule'"),
        (
            ZeroDivisionError("oops"),
            r"bad_rule registered for mylib.badrule.default raised on node "
            r"'badrule'.*ZeroDivisionError: oops",
        ),
    ],
)
def test_invalid_user_rule_is_a_clear_error(monkeypatch, rows, message):
    monkeypatch.setitem(_BAD, "rows", rows)
    with fake_world((2,), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = BadModel("badrule")
        with AutoParallel(model, lambda: (torch.empty(4, 8), torch.empty(4, 8)), mesh) as autop:
            with pytest.raises(ValueError, match=message):
                autop.optimize_placement()


@torch.library.custom_op("mylib::norule", mutates_args=())
def norule(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@norule.register_fake
def _(x, w):
    return torch.empty_like(x)


norule.register_autograd(_grad_x_only, setup_context=_no_context)


def test_missing_rule_error_points_at_register_sharding():
    with fake_world((2,), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = BadModel("norule")
        with AutoParallel(model, lambda: (torch.empty(4, 8), torch.empty(4, 8)), mesh) as autop:
            with pytest.raises(ValueError, match=r"(?s)mylib.norule.default.*register_sharding"):
                autop.optimize_placement()


SCENARIOS = [
    # the planner's own choice (on CPU ranks the tiny model stays replicated) ...
    {"name": "auto", "mesh": [2], "pin": [], "runtime": "program"},
    # ... and the user's row strategies forced: row shards in, Partial(sum) grad_w out
    {"name": "rows", "mesh": [2], "pin": ["rowscale"], "runtime": "program"},
    {"name": "rows_2d", "mesh": [1, 2], "pin": ["rowscale"], "runtime": "program"},
    {"name": "rows_interpreted", "mesh": [2], "pin": ["rowscale"], "runtime": "interpret"},
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun("user_rule_worker.py", SCENARIOS, tmp_path_factory.mktemp("ur"), nproc=2)


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_custom_op_runs_like_single_process(results, name):
    for r in ok_on_every_rank(results, name):
        for i, s in enumerate(r["steps"]):
            assert s["loss"] == pytest.approx(s["ref_loss"], rel=1e-5), f"step {i}: {s}"
            assert s["max_param_err"] < 1e-4, f"step {i}: {s}"
        if name != "auto":
            planned = r["planned"]
            assert planned["rowscale"]["outputs"][0][-1] == "S(0)"
            assert planned["rowscale_backward"]["outputs"][1][-1] == "P(sum)"
