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

from .plan import Plan, PlanSummary
from .plan_layers import fmt_layout, layers, load_json, load_plan, node_layer


def _ms(us) -> str:
    return f"{float(us) / 1e3:.3f} ms"


def diff_lines(a: Plan, b: Plan, limit: int = 20) -> list[str]:
    sa, sb = a.summary, b.summary
    out = ["totals (A -> B):"]
    for key, label in (
        ("total_us", "step"),
        ("compute_us", "compute"),
        ("comm_us", "communication"),
        ("exposed_comm_us", "exposed comm"),
        ("lower_bound_us", "lower bound"),
    ):
        x, y = getattr(sa, key), getattr(sb, key)
        out.append(f"  {label:<14} {_ms(x):>14} -> {_ms(y):>14}  ({(y - x) / 1e3:+.3f} ms)")
    pa, pb = sa.parameter_bytes_per_gpu, sb.parameter_bytes_per_gpu
    out.append(f"  {'params/GPU':<14} {pa / 2**20:>10.2f} MiB -> {pb / 2**20:>10.2f} MiB")
    la = {l.name: l for l in layers(a)}
    lb = {l.name: l for l in layers(b)}
    if a.node_info or b.node_info:
        out.append("per layer (time ms A -> B | params MiB/GPU A -> B):")
        for name in list(la) + [n for n in lb if n not in la]:
            x, y = la.get(name), lb.get(name)
            tx = (x.compute_us + x.comm_us) / 1e3 if x else 0.0
            ty = (y.compute_us + y.comm_us) / 1e3 if y else 0.0
            mx = x.param_bytes / 2**20 if x else 0.0
            my = y.param_bytes / 2**20 if y else 0.0
            if abs(tx - ty) > 1e-6 or abs(mx - my) > 1e-6:
                out.append(f"  {name:<20} {tx:10.3f} -> {ty:10.3f} | {mx:8.2f} -> {my:8.2f}")
    changed = []
    for name, ea in a.nodes.items():
        eb = b.nodes.get(name)
        if eb is None or (ea.outputs, ea.inputs) == (eb.outputs, eb.inputs):
            continue
        delta = eb.compute_us + eb.comm_us - ea.compute_us - ea.comm_us
        changed.append((abs(delta), name, ea, eb, delta))
    only = [n for n in b.nodes if n not in a.nodes] + [n for n in a.nodes if n not in b.nodes]
    out.append(
        f"{len(changed)} nodes changed layout"
        + (f" ({len(only)} nodes in only one " "plan)" if only else "")
        + (f"; the {limit} that moved the most cost:" if len(changed) > limit else ":")
    )
    for _, name, ea, eb, delta in sorted(changed, key=lambda c: (-c[0], c[1]))[:limit]:
        out.append(
            f"  {name} [{node_layer(name, b)}]: "
            f"{' '.join(fmt_layout(o) for o in ea.outputs)} -> "
            f"{' '.join(fmt_layout(o) for o in eb.outputs)}  "
            f"({delta / 1e3:+.3f} ms)"
        )
    return out


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
    from .options import PlannerOptions, enumerate_strategies, plan_graph
    from .presets import graph_options, resolve

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
