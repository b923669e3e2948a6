"""`autoshard diff A.json B.json` and `autoshard explain PLAN.json NODE [--graph GRAPH.json]`.

diff: the two plans' totals side by side, per layer what its time and parameter memory
became, and the nodes whose layouts differ with the cost each moved.

explain: a node's chosen layouts and costs; with the traced graph, why: the node is pinned
to each layout its op rules offer, the step is planned again each time (same options, same
time limit), and the totals are ranked, so "S(0),S(1) is chosen because the next best,
S(0),R, makes the step 2.1 ms slower" is read off the planner itself. The options are the
planner's defaults plus the plan's preset, when it names one: constraints given by hand
through the API are not in the plan JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from autoshard.planning.plan import Plan, PlanSummary
from autoshard.planning.plan_diff import _ms, diff_lines
from autoshard.planning.plan_layers import fmt_layout, load_json, load_plan, node_layer


def diff_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="autoshard diff", description="compare two plans")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--graph", help="traced graph JSON, for layers when the plans lack " "node_info")
    p.add_argument("--limit", type=int, default=20, help="changed nodes to list (default 20)")
    args = p.parse_args(argv)
    try:
        a, b = load_plan(args.a, args.graph), load_plan(args.b, args.graph)
    except (OSError, ValueError) as e:
        print(f"autoshard diff: {e}", file=sys.stderr)
        return 1
    print("\n".join(diff_lines(a, b, args.limit)))
    return 0


def alternatives(
    plan: Plan, graph: dict, node: str, time_limit: float, max_alternatives: int
) -> list[tuple[float, list, bool]]:
    """(planned step us, output layout, is the plan's own) per distinct output layout of
    ``node``, each planned with that layout pinned; sorted by cost."""
    from autoshard.planning.options import PlannerOptions, enumerate_strategies, plan_graph
    from autoshard.planning.presets import graph_options, resolve

    options = PlannerOptions(
        mesh_shape=plan.mesh_shape,
        mesh_dim_names=plan.mesh_dim_names,
        hardware=plan.hardware or "H100",
        time_limit_s=time_limit,
    )
    if plan.preset:
        options = graph_options(
            resolve(plan.preset, plan.mesh_shape, plan.mesh_dim_names), graph, options
        )
    graph_json = json.dumps(graph)
    strategies = enumerate_strategies(graph_json, options)["nodes"].get(node, [])
    chosen = plan.nodes[node].output
    layouts = [chosen]
    for s in strategies:
        out = (s.get("outputs") or [None])[0]
        if out is not None and out not in layouts:
            layouts.append(out)
    results = []
    for layout in layouts[: max_alternatives + 1]:
        pinned = options.replace(node_constraints={**options.node_constraints, node: layout})
        try:
            planned = plan_graph(graph_json, pinned)
            cost = PlanSummary.from_json(planned["summary"]).total_us
        except ValueError:  # no plan meets the constraints with this layout
            cost = float("inf")
        results.append((cost, layout, layout == chosen))
    return sorted(results, key=lambda r: r[0])


def explain_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="autoshard explain", description="why the plan chose a node's layout"
    )
    p.add_argument("plan")
    p.add_argument("node", help='graph node name (as in the plan\'s "nodes")')
    p.add_argument("--graph", help="traced graph JSON: re-plan with each alternative layout")
    p.add_argument(
        "--time-limit",
        type=float,
        default=2.0,
        help="planner time limit per alternative (default 2 s)",
    )
    p.add_argument("--max-alternatives", type=int, default=8)
    args = p.parse_args(argv)
    try:
        plan = load_plan(args.plan, args.graph)
        graph = load_json(args.graph) if args.graph else None
    except (OSError, ValueError) as e:
        print(f"autoshard explain: {e}", file=sys.stderr)
        return 1
    e = plan.nodes.get(args.node)
    if e is None:
        print(f"autoshard explain: the plan has no node {args.node!r}", file=sys.stderr)
        return 1
    info = plan.info(args.node)
    print(
        f"{args.node}: {info.get('op', '?')} in {node_layer(args.node, plan)}"
        + (f" (parameter {info['fqn']})" if info.get("fqn") else "")
    )
    print(f"  inputs  {' '.join(fmt_layout(i) for i in e.inputs) or '-'}")
    print(f"  outputs {' '.join(fmt_layout(o) for o in e.outputs)}")
    print(
        f"  compute {_ms(e.compute_us)}, communication {_ms(e.comm_us)}"
        f", {e.strategies if e.strategies is not None else '?'} strategies"
    )
    if graph is None:
        print("  (pass --graph GRAPH.json to re-plan with each alternative layout)")
        return 0
    ranked = alternatives(plan, graph, args.node, args.time_limit, args.max_alternatives)
    own = next(c for c, _, mine in ranked if mine)
    print(f"step planned with each output layout pinned ({args.time_limit:g} s each):")
    for cost, layout, mine in ranked:
        rel = "" if mine or cost == float("inf") else f"  ({(cost - own) / 1e3:+.3f} ms)"
        print(
            f"  {fmt_layout(layout):<20} {_ms(cost) if cost < float('inf') else 'infeasible':>14}"
            f"{rel}{'  <- chosen' if mine else ''}"
        )
    return 0
