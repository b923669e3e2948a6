"""The step's schedule (trace/step_schedule.py) is the one answer the planner and the runtime
read: the phases in the graph JSON and the interpreter's forward / backward split both come
from it, and it agrees with what autograd's partitioner tagged."""

from __future__ import annotations

import json

import pytest
import torch

from autoshard.models import TinyGPT
from autoshard.planning.graph_export import graph_json
from autoshard.program.interpreter import StepRunner
from autoshard.trace.fake_pg import fake_world
from autoshard.trace.step_schedule import BACKWARD, FORWARD
from autoshard.trace.tracer import trace_training_step


@pytest.fixture(scope="module")
def step():
    with torch.device("meta"):
        model = TinyGPT(32, 4, 64)
    ids = lambda: (torch.zeros(4, 8, dtype=torch.long), torch.zeros(4, 8, dtype=torch.long))
    return trace_training_step(model, ids, torch.device("cpu"), capture="dynamo")


def _tangent_readers(step) -> set[str]:
    reads = set(step.tangent_of)
    for n in step.gm.graph.nodes:
        if n.op == "call_function" and any(a.name in reads for a in n.all_input_nodes):
            reads.add(n.name)
    return reads


def test_phases_are_autograds_and_the_early_nodes_read_no_tangent(step):
    s = step.schedule
    calls = [n for n in step.gm.graph.nodes if n.op == "call_function"]
    assert set(s.phase) == set(s.runs_in) == {n.name for n in calls}
    tags = {n.name: n.meta.get("partitioner_tag") for n in calls}
    for name, phase in s.phase.items():
        if tags[name] == "is_backward":
            assert phase == BACKWARD, name
        elif tags[name] == "is_forward":
            assert phase == FORWARD, name
    readers = _tangent_readers(step)
    assert {n for n, p in s.runs_in.items() if p == BACKWARD} == readers - set(step.tangent_of)
    # the backward nodes that run in the forward: what reads no tangent (weight transposes
    # for the input gradients, detaches), never a node that reads one
    assert s.early and not (s.early & readers)
    assert {str(n.target) for n in calls if n.name in s.early} <= {
        "aten.t.default",
        "aten.detach.default",
        "aten.permute.default",
        "aten.transpose.int",
    }
    assert s.recompute == frozenset() and s.stage == {}


def test_the_planner_and_the_runtime_read_the_same_schedule(step):
    s = step.schedule
    exported = {n["name"]: n.get("phase") for n in json.loads(graph_json(step))["nodes"]}
    for name, phase in s.phase.items():
        if name in exported:  # getitems are folded into their producers
            assert exported[name] == phase, name
    with fake_world((1,), device_type="cpu") as mesh:
        runner = StepRunner(step, {"nodes": {}}, mesh)
    assert [n.name for n in runner.forward_nodes] == [
        n.name for n in step.gm.graph.nodes if s.runs_in.get(n.name) == FORWARD
    ]
    assert [n.name for n in runner.backward_nodes] == [
        n.name for n in step.gm.graph.nodes if s.runs_in.get(n.name) == BACKWARD
    ]
    assert runner.saved_names == set(s.saved)
    # every saved value is made in the forward (or is a graph input) and read after it
    made_in_forward = {n for n, p in s.runs_in.items() if p == FORWARD}
    placeholders = {n.name for n in step.gm.graph.find_nodes(op="placeholder")}
    assert s.saved <= made_in_forward | placeholders


def test_the_schedule_is_computed_once_and_again_after_an_edit(step):
    first = step.schedule
    assert step.schedule is first
    gm = step.gm
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_after(node):
        extra = gm.graph.call_function(torch.ops.aten.clone.default, (node,))
    try:
        assert extra.name in step.schedule.phase
    finally:
        gm.graph.erase_node(extra)
    assert extra.name not in step.schedule.phase
