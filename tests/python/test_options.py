"""PlannerOptions (python/autoshard/options.py): the typed options and their JSON form."""

from __future__ import annotations

import json

import pytest

from autoshard import _core
from autoshard.planning.options import PlannerOptions, enumerate_strategies
from tiny_graphs import tiny_graph


def test_json_round_trip_keeps_every_field():
    opts = PlannerOptions(
        mesh_shape=[2, 4],
        mesh_dim_names=["dp", "tp"],
        hardware="H100",
        input_constraints={"x": ["S(0)", "R"]},
        output_constraints={"0": ["S(0)", "R"]},
        node_constraints={"mm": ["R", "S(1)"]},
        parameter_memory=(0.0, 0.25),
        memory_limit_bytes=1 << 30,
        time_limit_s=3.0,
        gap_tolerance=0.01,
        max_problem_bytes=1 << 32,
        repeated_layers="untie",
        verbose=True,
    )
    assert PlannerOptions.from_json(json.loads(opts.dumps())) == opts


def test_defaults_are_left_out_of_the_json():
    d = PlannerOptions(mesh_shape=[4]).to_json()
    assert d["mesh"] == {"shape": [4], "dim_names": None}
    for key in ("parameter_memory", "time_limit_s", "gap_tolerance", "repeated_layers"):
        assert key not in d  # the planner's own defaults apply
    assert (
        PlannerOptions(mesh_shape=[4], parameter_memory=None).to_json()["parameter_memory"] is None
    )


def test_replace_leaves_the_original_alone():
    base = PlannerOptions(mesh_shape=[2], node_constraints={"a": ["R"]})
    pinned = base.replace(node_constraints={**base.node_constraints, "b": ["S(0)"]})
    assert base.node_constraints == {"a": ["R"]} and set(pinned.node_constraints) == {"a", "b"}


def test_bad_json_is_refused_with_the_key_named():
    with pytest.raises(ValueError, match="needs a 'shape'"):
        PlannerOptions.from_json({"mesh": {}})
    with pytest.raises(ValueError, match=r"unknown keys \['time_limit'\]"):
        PlannerOptions.from_json({"mesh": {"shape": [2]}, "time_limit": 3})


@pytest.mark.skipif(not hasattr(_core, "enumerate_strategies"), reason="C++ core not built")
def test_the_core_reads_the_json_it_writes():
    found = enumerate_strategies(tiny_graph(), PlannerOptions(mesh_shape=[2]))
    assert found["nodes"]["y"] and not found["unsupported"]


def test_time_spent_before_the_planner_call_comes_off_its_limit():
    opts = PlannerOptions(mesh_shape=[2], time_limit_s=10.0)
    assert opts.after(3.0).time_limit_s == 7.0
    assert opts.after(30.0).time_limit_s == 1.0  # the planner always gets a share
    assert PlannerOptions(mesh_shape=[2]).after(5.0).time_limit_s == 15.0  # default 20 s
