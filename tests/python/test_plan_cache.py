"""The on-disk plan cache (autoshard/plan_cache.py): a hit returns the stored plan without
calling the solver and says so in the log; any change of graph, mesh, constraints,
hardware or options misses; a corrupt entry warns and is planned again; plan_cache=False
(and a folder of the user's choosing) work. Every test here caches in its own tmp folder."""

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import Shard

from autoshard import AutoParallel, _core
from autoshard.trace.fake_pg import fake_world
from autoshard.models import MLP
from autoshard.planning.plan_cache import ENV_DIR, PlanCache, default_directory, plan_key

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


@pytest.fixture
def mesh2():
    with fake_world((2,), device_type="cpu") as mesh:
        yield mesh


@pytest.fixture
def counted(monkeypatch):
    """Counts calls of the C++ planner."""
    calls = []
    real = _core.plan_graph

    def plan_graph(graph, options):
        calls.append(json.loads(options))
        return real(graph, options)

    monkeypatch.setattr(_core, "plan_graph", plan_graph)
    return calls


def _mlp():
    with torch.device("meta"):
        return MLP(16, 32, 2)


def _inputs():
    return torch.empty(8, 16), torch.empty(8, 16)


def _plan(mesh, **kw):
    high = kw.pop("high", None)
    with AutoParallel(_mlp(), _inputs, mesh, hardware="H100", **kw) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        autop.add_parameter_memory_constraint(high=high)
        return autop.optimize_placement().plan


def _core_of(plan):
    """The planner's output, without the cache's marker and the time it took."""
    return {k: v for k, v in plan.items() if k not in ("plan_cache", "plan_seconds")}


def test_tests_never_use_the_users_cache():
    # conftest points every test at a fresh tmp folder
    assert os.environ[ENV_DIR]
    assert default_directory() == PlanCache.resolve(True).directory
    assert default_directory() != Path(os.path.expanduser("~")) / ".cache" / "autoshard" / "plans"


def test_hit_returns_the_stored_plan_without_solving(mesh2, counted, caplog):
    first = _plan(mesh2)
    assert len(counted) == 1
    assert first["plan_cache"]["hit"] is False
    key = first["plan_cache"]["key"]
    assert (default_directory() / f"{key}.json").is_file()
    with caplog.at_level(logging.INFO, logger="autoshard"):
        second = _plan(mesh2)
    assert len(counted) == 1, "a cache hit must not call the solver"
    assert second["plan_cache"] == {"key": key, "hit": True}
    assert _core_of(second) == _core_of(first)
    assert any(f"plan cache hit (key {key[:16]}" in r.getMessage() for r in caplog.records)


def test_changed_options_miss(mesh2, counted):
    base = _plan(mesh2)
    keys = {base["plan_cache"]["key"]}
    for kw in (
        {"time_limit_s": 5.0},
        {"gap_tolerance": 0.0},
        {"high": 1.0},
        {"memory_limit_bytes": 10**9},
    ):
        plan = _plan(mesh2, **kw)
        assert plan["plan_cache"]["hit"] is False, kw
        keys.add(plan["plan_cache"]["key"])
    assert len(keys) == 5 and len(counted) == 5
    with AutoParallel(_mlp(), _inputs, mesh2, hardware="A100") as autop:  # other hardware
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        assert autop.optimize_placement().plan["plan_cache"]["hit"] is False
    assert len(counted) == 6


def test_key_covers_graph_mesh_and_constraints():
    opts = {
        "mesh": {"shape": [2], "dim_names": None},
        "hardware": "H100",
        "input_constraints": {"x": ["S(0)"]},
        "output_constraints": {},
        "node_constraints": {},
        "verbose": False,
    }
    k = plan_key('{"nodes": []}', opts)
    assert k == plan_key('{"nodes": []}', dict(opts, verbose=True))  # verbose: same plan
    assert k != plan_key('{"nodes": [], "x": 1}', opts)
    assert k != plan_key('{"nodes": []}', dict(opts, mesh={"shape": [4], "dim_names": None}))
    assert k != plan_key('{"nodes": []}', dict(opts, input_constraints={"x": ["R"]}))
    assert k != plan_key('{"nodes": []}', dict(opts, node_constraints={"mm": ["R"]}))
    assert k != plan_key('{"nodes": []}', dict(opts, hardware={"base": "CPU"}))


@pytest.mark.parametrize(
    "damage",
    ["not json {", '{"format": 1}', "[]", '{"format": 999, "key": "K", "plan": {"nodes": {}}}'],
)
def test_corrupt_entry_warns_and_plans_again(mesh2, counted, damage):
    first = _plan(mesh2)
    key = first["plan_cache"]["key"]
    path = default_directory() / f"{key}.json"
    path.write_text(damage.replace('"K"', json.dumps(key)))
    with pytest.warns(RuntimeWarning, match="corrupt plan cache entry"):
        again = _plan(mesh2)
    assert len(counted) == 2
    assert again["plan_cache"]["hit"] is False
    assert again["nodes"] == first["nodes"]  # planned again: the same plan (its times differ)
    # the new plan replaced the damaged entry
    assert json.loads(path.read_text())["key"] == key
    assert _plan(mesh2)["plan_cache"]["hit"] is True
    assert len(counted) == 2


def test_disabled_cache_always_plans(mesh2, counted):
    a = _plan(mesh2, plan_cache=False)
    b = _plan(mesh2, plan_cache=False)
    assert len(counted) == 2
    assert "plan_cache" not in a and "plan_cache" not in b
    assert not default_directory().exists() or not any(default_directory().iterdir())


def test_folder_argument_overrides_the_environment(mesh2, counted, tmp_path):
    folder = tmp_path / "my plans"
    first = _plan(mesh2, plan_cache=folder)
    assert (folder / f"{first['plan_cache']['key']}.json").is_file()
    assert not default_directory().exists() or not any(default_directory().iterdir())
    assert _plan(mesh2, plan_cache=str(folder))["plan_cache"]["hit"] is True
    assert len(counted) == 1


def test_unwritable_folder_warns_but_plans(mesh2, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(RuntimeWarning, match="cannot store the plan"):
        plan = _plan(mesh2, plan_cache=blocker / "plans")
    assert plan["nodes"]


def test_bad_settings_are_refused(mesh2):
    with pytest.raises(TypeError, match="plan_cache must be True, False or a folder"):
        AutoParallel(_mlp(), _inputs, mesh2, plan_cache=3)
    with pytest.raises(ValueError, match="gap_tolerance must be a fraction"):
        AutoParallel(_mlp(), _inputs, mesh2, gap_tolerance=1.5)


def test_gap_tolerance_reaches_the_planner(mesh2, counted):
    _plan(mesh2, gap_tolerance=0.01, plan_cache=False)
    assert counted[-1]["gap_tolerance"] == 0.01
    _plan(mesh2, plan_cache=False)
    assert "gap_tolerance" not in counted[-1]  # the planner's default (0.001)
