"""passes/in_flight.limit_in_flight (issue 47): on gloo, several collectives of one process group in
flight at once corrupted the heap; the eager program keeps at most one in flight. Graph
rewriting only: no process group is needed."""

from __future__ import annotations

import torch
import torch.fx as fx

from autoshard.program.graph_nodes import is_collective, is_wait
from autoshard.program.passes.in_flight import limit_in_flight

_c10d = torch.ops._c10d_functional


def _max_in_flight(gm: fx.GraphModule) -> int:
    in_flight, worst = set(), 0
    for n in gm.graph.nodes:
        if is_collective(n):
            in_flight.add(n)
            worst = max(worst, len(in_flight))
        elif is_wait(n):
            in_flight.discard(n.args[0])
    return worst


def _prefetched_gathers() -> fx.GraphModule:
    """Three gathers issued at the top (a prefetch), waited where needed, compute between;
    and a reduction of a collective issued before the graph (a waited graph input)."""
    g = fx.Graph()
    a, b, c, early = (g.placeholder(x) for x in ("a", "b", "c", "early"))
    gathers = [
        g.call_function(_c10d.all_gather_into_tensor.default, (x, 2, "0")) for x in (a, b, c)
    ]
    acc = g.call_function(torch.ops.aten.mul.Tensor, (a, 2))
    for k, coll in enumerate(gathers):
        w = g.call_function(_c10d.wait_tensor.default, (coll,))
        acc = g.call_function(
            torch.ops.aten.add.Tensor, (acc, g.call_function(torch.ops.aten.sum.default, (w,)))
        )
        if k == 0:
            red = g.call_function(_c10d.all_reduce.default, (acc, "sum", "0"))
    w_early = g.call_function(_c10d.wait_tensor.default, (early,))
    w_red = g.call_function(_c10d.wait_tensor.default, (red,))
    g.output((acc, w_red, w_early))
    return fx.GraphModule(torch.nn.Module(), g)


def test_one_in_flight():
    gm = _prefetched_gathers()
    assert _max_in_flight(gm) == 3
    moved = limit_in_flight(gm, 1)
    assert moved > 0
    assert _max_in_flight(gm) == 1
    # the wait of the collective issued before the graph comes before any new collective
    first_coll = next(n for n in gm.graph.nodes if is_collective(n))
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    w_early = next(n for n in gm.graph.nodes if is_wait(n) and n.args[0].op == "placeholder")
    assert order[w_early] < order[first_coll]
    gm.graph.lint()  # every value still defined before its use


def test_limit_two_keeps_two():
    gm = _prefetched_gathers()
    limit_in_flight(gm, 2)
    assert _max_in_flight(gm) <= 2


def test_nothing_to_move():
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.call_function(
        _c10d.wait_tensor.default, (g.call_function(_c10d.all_reduce.default, (x, "sum", "0")),)
    )
    g.output(w)
    gm = fx.GraphModule(torch.nn.Module(), g)
    assert limit_in_flight(gm, 1) == 0


def test_gloo_programs_keep_one_collective_in_flight_and_nccl_ones_overlap():
    """The pipeline applies the limit to the programs that run where waits block the host
    (gloo); the scheduled graphs (parallel_gm) keep their prefetch."""
    from autoshard.program import pipeline

    gm = _prefetched_gathers()
    for defer, most in ((True, 1), (False, 3)):
        graphs = pipeline.ProgramGraphs(_prefetched_gathers(), _prefetched_gathers())
        context = pipeline.PassContext(1, [], None, None, eager=False, defer=defer)
        info: dict = {}
        assert pipeline.RUN_PASSES[-1].name == "waits_moved_for_one_in_flight"
        pipeline.run_passes(pipeline.RUN_PASSES[-1:], graphs, context, info)
        assert _max_in_flight(graphs.fwd) == most
        assert ("waits_moved_for_one_in_flight" in info) == defer
    assert _max_in_flight(gm) == 3
