"""The step's schedule as data: which pass each node belongs to, which pass runs it, and
which forward values the backward reads. Computed once per traced step
(``TracedStep.schedule``); the planner exports its phases (graph_export.py) and the
runtime splits the step by it (program/interpreter.py), so the two read one answer.

Two facts per node, kept apart because they may differ:
- ``phase``: the pass autograd put the node in (AOT's partitioner tag; a node without
  one is backward when it reads a tangent, transitively). The planner prices each node
  in its phase.
- ``runs_in``: the pass that runs it. A backward node that reads no tangent (the
  transpose of a weight for the input gradient, a detach) can run in either pass; today
  every such node runs in the forward (``early``) and its output is saved for the
  backward. Choosing per node between that and running it in the backward (a weight
  gathered again instead of kept: FSDP's reshard after forward), and recomputing forward
  values in the backward (``recompute``), is the planner's next choice; a pipeline stage
  per node (``stage``) is the one after.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch.fx as fx

FORWARD = "forward"
BACKWARD = "backward"


@dataclass(frozen=True)
class StepSchedule:
    phase: dict[str, str]  # call_function node name -> FORWARD / BACKWARD (autograd's)
    runs_in: dict[str, str]  # call_function node name -> the pass that runs it
    # backward nodes run in the forward (they read no tangent); their outputs are saved
    early: frozenset[str]
    # forward values (placeholders included) the backward reads or the gradients are
    saved: frozenset[str]
    # room for the planner's choices to come: forward nodes recomputed in the backward,
    # and each node's pipeline stage
    recompute: frozenset[str] = frozenset()
    stage: dict[str, int] = field(default_factory=dict)

    def nodes_run_in(self, gm: fx.GraphModule, which: str) -> list[fx.Node]:
        """The call_function nodes that run in pass ``which``, in graph order."""
        return [
            n
            for n in gm.graph.nodes
            if n.op == "call_function" and self.runs_in.get(n.name) == which
        ]


def _tangent_readers(gm: fx.GraphModule, tangents: set[str]) -> set[str]:
    """Names of the call_function nodes that read a tangent, transitively."""
    reads: set[str] = set(tangents)
    for n in gm.graph.nodes:
        if n.op == "call_function" and any(a.name in reads for a in n.all_input_nodes):
            reads.add(n.name)
    return reads - tangents


def _autograd_phase(node: fx.Node, tangent_readers: set[str]) -> str:
    tag = node.meta.get("partitioner_tag")
    if tag == "is_backward":
        return BACKWARD
    if tag == "is_forward":
        return FORWARD
    return BACKWARD if node.name in tangent_readers else FORWARD


def schedule_step(
    gm: fx.GraphModule, tangents: set[str], grad_outputs: list[fx.Node]
) -> StepSchedule:
    """The schedule of the joint graph ``gm`` whose tangent placeholders are ``tangents``;
    ``grad_outputs``: the nodes the step returns as gradients (read after the backward)."""
    readers = _tangent_readers(gm, tangents)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    phase = {n.name: _autograd_phase(n, readers) for n in calls}
    runs_in = {n.name: BACKWARD if n.name in readers else FORWARD for n in calls}
    early = frozenset(n for n, p in phase.items() if p == BACKWARD and runs_in[n] == FORWARD)
    saved: set[str] = set()
    backward_reads = [a for n in calls if runs_in[n.name] == BACKWARD for a in n.all_input_nodes]
    for a in backward_reads + list(grad_outputs):
        if a.name in readers or a.name in tangents:
            continue
        if a.op == "call_function" and a.target is operator.getitem:
            a = a.args[0]
        saved.add(a.name)
    return StepSchedule(phase=phase, runs_in=runs_in, early=early, saved=frozenset(saved))
