"""The passes that turn a captured step (capture.py) into the program a rank runs, listed
in the order they run. Each pass is ``run(graphs, context) -> statistics``: it rewrites the
forward and backward graphs in place and its statistics are kept in the program's ``info``
under the pass's name (or, for a pass that ``merges``, its dict of statistics merged in).

- SCHEDULING_PASSES, on the graphs as traced (``parallel_gm`` shows their result): fewer
  round trips for small reductions, collectives bucketed per block, and every collective
  issued where its input is ready and waited for just before its result is used.
- RUN_PASSES, on copies of those graphs, the ones that run: the loss scale moved to the
  backward's end where waits block the host, for eager programs in-place reductions and
  direct calls of common ops (inductor wants functional graphs and does both itself), and
  where waits block the host (gloo) one collective in flight at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch.fx as fx

from autoshard.program.capture import CapturedStep
from autoshard.program.graph_nodes import OUTSIDE, PARAM_KEY, is_wait, strip_views
from autoshard.program.interpreter import StepRunner
from autoshard.program.local_program import LocalProgram, _graph_outputs, copy_graph_module
from autoshard.program.passes.deferred_tail import defers_round_trips, split_forward
from autoshard.program.passes.direct_calls import bind_direct_calls
from autoshard.program.passes.fuse_reductions import (
    coalesce_small_reductions,
    count_targets_early,
    split_normalised_reductions,
)
from autoshard.program.passes.in_flight import limit_in_flight
from autoshard.program.passes.in_place import divide_in_place, reduce_in_place
from autoshard.program.passes.late_loss_scale import scale_gradients_late
from autoshard.program.passes.overlap import bucket_gathers, bucket_reductions, schedule_collectives
from autoshard.program.passes.simplify import simplify


@dataclass
class ProgramGraphs:
    fwd: fx.GraphModule
    bwd: fx.GraphModule

    @property
    def both(self) -> tuple[fx.GraphModule, fx.GraphModule]:
        return self.fwd, self.bwd


@dataclass(frozen=True)
class PassContext:
    """What the passes read besides the graphs."""

    n_outputs: int  # the forward's first outputs are the module's; the rest are saved
    # backward output k -> the FQN of the parameter it is the gradient of (None: not one)
    grad_of: list[str | None]
    prefetch_bytes: int | None  # overlap.py's limits (None: its defaults)
    bucket_bytes: int | None
    eager: bool  # the program runs eagerly (not compiled by inductor)
    defer: bool  # the forward's last round trip is not waited for at its end (gloo)


@dataclass(frozen=True)
class GraphPass:
    name: str  # where its statistics go in the program's info
    run: Callable[[ProgramGraphs, PassContext], Any]
    when: Callable[[PassContext], bool] = lambda context: True
    merges: bool = False  # its statistics are a dict of info entries, not one entry


def _sum_over_both(fn: Callable[[fx.GraphModule], int]) -> Callable:
    return lambda g, c: sum(fn(gm) for gm in g.both)


SCHEDULING_PASSES: tuple[GraphPass, ...] = (
    GraphPass("early_target_counts", lambda g, c: count_targets_early(g.fwd)),
    GraphPass("split_normalised_reductions", _sum_over_both(split_normalised_reductions)),
    GraphPass("forward_gather_buckets", lambda g, c: bucket_gathers(g.fwd, c.bucket_bytes)),
    GraphPass("backward_gather_buckets", lambda g, c: bucket_gathers(g.bwd, c.bucket_bytes)),
    GraphPass(
        "backward_reduction_buckets",
        lambda g, c: bucket_reductions(g.bwd, c.bucket_bytes, c.grad_of),
    ),
    GraphPass("coalesced_small_reductions", _sum_over_both(coalesce_small_reductions)),
    GraphPass("forward_schedule", lambda g, c: schedule_collectives(g.fwd, c.prefetch_bytes)),
    GraphPass("backward_schedule", lambda g, c: schedule_collectives(g.bwd, c.prefetch_bytes)),
)


def _late_loss_scale(g: ProgramGraphs, c: PassContext) -> dict:
    """The count of targets (all-reduced early so the backward's start need not wait) and
    the loss sum in one all-reduce when the backward divides by the count at its end
    instead: one round trip a step instead of two, and the forward waits for neither."""
    if not c.defer:
        return {"late_loss_scale": 0}
    together = copy_graph_module(g.fwd)
    if coalesce_small_reductions(together, hold_back=True) and scale_gradients_late(
        together, g.bwd, c.n_outputs
    ):
        g.fwd = together
        return {"late_loss_scale": 1, "loss_reductions_held_back": 1}
    return {"late_loss_scale": scale_gradients_late(g.fwd, g.bwd, c.n_outputs)}


def _eager(c: PassContext) -> bool:
    return c.eager


RUN_PASSES: tuple[GraphPass, ...] = (
    GraphPass("late_loss_scale", _late_loss_scale, merges=True),
    GraphPass("all_reduces_in_place", _sum_over_both(reduce_in_place), when=_eager),
    GraphPass("divisions_in_place", lambda g, c: divide_in_place(g.bwd), when=_eager),
    GraphPass("direct_calls", _sum_over_both(bind_direct_calls), when=_eager),
    # where waits block the host (gloo), one collective in flight at a time
    # (passes/in_flight.py); each still overlaps compute
    GraphPass(
        "waits_moved_for_one_in_flight",
        _sum_over_both(lambda gm: limit_in_flight(gm, 1)),
        when=lambda c: c.defer,
    ),
)


def run_passes(passes: tuple[GraphPass, ...], g: ProgramGraphs, c: PassContext, info: dict):
    for p in passes:
        if not p.when(c):
            continue
        stats = p.run(g, c)
        if p.merges:
            info.update(stats)
        else:
            info[p.name] = stats


def build_program(
    captured: CapturedStep,
    runner: StepRunner,
    *,
    prefetch_bytes: int | None = None,
    bucket_bytes: int | None = None,
    eager: bool = True,
) -> LocalProgram:
    """The captured step through the pipeline: the scheduled graphs (``fwd_gm`` /
    ``bwd_gm``) and the ones that run (``fwd`` / ``bwd``)."""
    n_out = captured.n_outputs
    graphs = ProgramGraphs(captured.fwd_gm, captured.bwd_gm)
    info: dict = {"saved_tensors": len(_graph_outputs(graphs.fwd)) - n_out}
    for gm in graphs.both:
        _tidy(gm)
    param_fqns = [runner.step.param_fqns[n] for n in runner.param_names]
    _mark_parameters(graphs.fwd, graphs.bwd, param_fqns, n_out)
    # backward output k is the gradient of flat input tensor_pos[k]: params come first
    grad_of = [
        param_fqns[i] if i < len(param_fqns) else None for i in captured.input_tensor_positions
    ]
    # only where waits block the host (gloo), not on NCCL (deferred_tail.defers_round_trips)
    defer = defers_round_trips(runner.mesh)
    context = PassContext(n_out, grad_of, prefetch_bytes, bucket_bytes, eager, defer)
    run_passes(SCHEDULING_PASSES, graphs, context, info)
    for gm in graphs.both:
        _tidy(gm)  # the buckets' flattening adds views of 1-D shards
        _label_outside_nodes(gm)
    program = LocalProgram(
        graphs.fwd,
        graphs.bwd,
        n_out,
        captured.output_slots,
        captured.input_tensor_positions,
        info=info,
    )
    # what runs: copies of the graphs, rewritten for the eager (or inductor-compiled) step;
    # fwd_gm / bwd_gm stay as traced and scheduled (parallel_gm, torch.compile of the
    # module, which traces them under Dynamo)
    run = ProgramGraphs(copy_graph_module(graphs.fwd), copy_graph_module(graphs.bwd))
    info["deferred_round_trips"] = int(defer)
    run_passes(RUN_PASSES, run, context, info)
    program.fwd, program.bwd = run.fwd, run.bwd
    program.run_fwd_gm, program.run_bwd_gm = run.fwd, run.bwd
    program.one_in_flight = defer
    program.split = split_forward(run.fwd, n_out) if defer else None
    info["deferred_forward_outputs"] = len(program.split.from_tail) if program.split else 0
    return program


def _mark_parameters(
    fwd_gm: fx.GraphModule, bwd_gm: fx.GraphModule, fqns: list[str], n_outputs: int
) -> None:
    """Name the parameter behind each placeholder: the forward's first inputs are the
    parameters' shards; a backward input is one when the forward saved that shard as is.
    The overlap pass buckets parameter gathers per block with these names."""
    fwd_inputs = [n for n in fwd_gm.graph.nodes if n.op == "placeholder"]
    for node, fqn in zip(fwd_inputs, fqns):
        node.meta[PARAM_KEY] = fqn
    saved = _graph_outputs(fwd_gm)[n_outputs:]
    bwd_inputs = [n for n in bwd_gm.graph.nodes if n.op == "placeholder"]
    for src, node in zip(saved, bwd_inputs):
        fqn = strip_views(src).meta.get(PARAM_KEY) if isinstance(src, fx.Node) else None
        if fqn is not None:
            node.meta[PARAM_KEY] = fqn


def _tidy(gm: fx.GraphModule) -> None:

    simplify(gm)


def _label_outside_nodes(gm: fx.GraphModule) -> None:
    """Ops that no joint-graph node ran (the graph outputs' redistribution, after the last
    node) name ``OUTSIDE`` in ``meta["custom"]``, as every other op names its node: only
    waits carry no name (AutoParallel's parallel_gm leaves its collectives' waits bare)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.meta.get("custom") is None and not is_wait(n):
            n.meta["custom"] = {"autoshard_node": OUTSIDE}
