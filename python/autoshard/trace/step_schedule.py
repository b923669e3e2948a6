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
  values in the backward (``recompute``), are the planner's choices (the plan's
  ``recompute`` list: ``with_recompute``); a pipeline stage per node (``stage``) is next.

Recomputation: a forward node in ``recompute`` still runs in the forward (its forward
readers need it) but its value is not kept: the backward runs it again, right before the
first backward node that reads it (``backward_order``), from the values that are kept (its
own inputs, recomputed in turn where they are in ``recompute`` too). An early node in
``recompute`` runs in the backward only: what it reads is kept instead of its output (a
weight kept sharded and gathered again: reshard after forward). Ops that draw random
numbers and ops that write their inputs are never recomputed (``recomputable``): their
outputs are kept, so a recomputed region sees the same random numbers.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
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
    # forward nodes the backward runs again (the plan's choice; with_recompute), and each
    # node's pipeline stage (to come)
    recompute: frozenset[str] = frozenset()
    stage: dict[str, int] = field(default_factory=dict)
    # what the saved set is computed from: the tangent placeholders, and the nodes the step
    # returns as gradients
    tangents: frozenset[str] = frozenset()
    grad_outputs: tuple[str, ...] = ()

    def nodes_run_in(self, gm: fx.GraphModule, which: str) -> list[fx.Node]:
        """The call_function nodes that run in pass ``which``, in graph order."""
        return [
            n
            for n in gm.graph.nodes
            if n.op == "call_function" and self.runs_in.get(n.name) == which
        ]

    def backward_order(self, gm: fx.GraphModule) -> list[fx.Node]:
        """The nodes the backward runs, in order: the backward's own in graph order, each
        preceded by the recomputed forward nodes it reads that have not run yet (their
        recomputed inputs first)."""
        placed: set[str] = set()
        order: list[fx.Node] = []

        def place(n: fx.Node) -> None:
            if n.name in placed:
                return
            for a in n.all_input_nodes:
                if a.name in self.recompute and self.runs_in.get(a.name) == FORWARD:
                    place(a)
            placed.add(n.name)
            order.append(n)

        for n in self.nodes_run_in(gm, BACKWARD):
            place(n)
        return order

    def with_recompute(self, gm: fx.GraphModule, names: Iterable[str]) -> StepSchedule:
        """This schedule with the forward nodes ``names`` recomputed in the backward (and
        with the getitems of a recomputed multi-output node). Raises ValueError naming a
        node that is not in the graph, not run in the forward, or not recomputable."""
        names = set(names)
        if not names:
            return self
        nodes = {n.name: n for n in gm.graph.nodes if n.op == "call_function"}
        for name in sorted(names):
            node = nodes.get(name)
            if node is None:
                raise ValueError(f"the plan recomputes '{name}', which is not a node of the step")
            if self.runs_in[name] != FORWARD:
                raise ValueError(f"the plan recomputes '{name}', which the forward does not run")
            if not recomputable(node):
                raise ValueError(
                    f"the plan recomputes '{name}' ({node.target}), which draws random numbers "
                    "or writes its inputs: its output must be kept; plan again"
                )
        # a multi-output node's getitems go with it; an early node that reads one run in
        # the backward runs there too
        pending = list(names)
        while pending:
            node = nodes[pending.pop()]
            for u in node.users:
                follows = u.target is operator.getitem or (
                    node.name in self.early and u.name in self.early
                )
                if follows and u.name not in names:
                    names.add(u.name)
                    pending.append(u.name)
        runs_in = dict(self.runs_in)
        for name in names & self.early:
            runs_in[name] = BACKWARD
        recompute = frozenset(n for n in names if runs_in[n] == FORWARD)
        saved = _saved_values(gm, runs_in, recompute, self.tangents, self.grad_outputs)
        return dataclasses.replace(
            self,
            runs_in=runs_in,
            early=self.early - names,
            saved=saved,
            recompute=recompute,
        )


def recomputable(node: fx.Node) -> bool:
    """Whether the backward may run ``node`` again: a functional op that draws no random
    numbers (its second run gives the same value)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    tags = getattr(node.target, "tags", ())
    schema = getattr(node.target, "_schema", None)
    if torch.Tag.nondeterministic_seeded in tags or schema is None or schema.is_mutable:
        return False
    return schema.name.startswith("aten::")


def _saved_values(
    gm: fx.GraphModule,
    runs_in: dict[str, str],
    recompute: frozenset[str],
    tangents: frozenset[str],
    grad_outputs: Sequence[str],
) -> frozenset[str]:
    """The forward values (placeholders included) that cross to the backward: what the
    backward's nodes, the recomputed nodes and the gradients read, except tangents,
    backward values and recomputed values (a multi-output node is kept whole)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    saved: set[str] = set()
    readers = [n for n in gm.graph.nodes if runs_in.get(n.name) == BACKWARD or n.name in recompute]
    reads = [a for n in readers for a in n.all_input_nodes]
    for a in reads + [by_name[g] for g in grad_outputs]:
        if a.name in tangents or runs_in.get(a.name) == BACKWARD or a.name in recompute:
            continue
        if a.op == "call_function" and a.target is operator.getitem:
            a = a.args[0]
        saved.add(a.name)
    return frozenset(saved)


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
    grads = tuple(g.name for g in grad_outputs)
    tangent_names = frozenset(tangents)
    saved = _saved_values(gm, runs_in, frozenset(), tangent_names, grads)
    return StepSchedule(
        phase=phase,
        runs_in=runs_in,
        early=early,
        saved=saved,
        tangents=tangent_names,
        grad_outputs=grads,
    )
