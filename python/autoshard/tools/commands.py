"""The `autoshard` subcommands written in Python (cli.py dispatches here):

    autoshard view PLAN.json [--graph GRAPH.json] [--out DIR]     plan_view.py
    autoshard explain PLAN.json NODE [--graph GRAPH.json]          plan_compare.py
    autoshard diff A.json B.json [--graph GRAPH.json]              plan_compare.py
    autoshard plan GRAPH.json --mesh 8x8 --preset NAME [...]       below

`autoshard plan` without --preset stays the C++ command; with it, the preset's input
constraints need the graph's input names, which the C++ flags cannot carry, so Python
builds the planner options (the same flags) and calls the same planner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from autoshard.planning.options import DEFAULT_TIME_LIMIT_S, PlannerOptions, plan_graph


def python_command(argv: list[str]):
    """The Python implementation of ``argv``'s subcommand, or None for the C++ one."""
    if not argv:
        return None
    if argv[0] == "view":
        from autoshard.tools.plan_view import main

        return main
    if argv[0] in ("explain", "diff"):
        from autoshard.tools import plan_compare

        return plan_compare.explain_main if argv[0] == "explain" else plan_compare.diff_main
    if argv[0] == "plan" and any(a == "--preset" or a.startswith("--preset=") for a in argv):
        return plan_with_preset
    return None


def _mesh(text: str) -> list[int]:
    try:
        shape = [int(x) for x in text.lower().split("x")]
    except ValueError:
        shape = []
    if not shape or any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(
            f"'{text}' is not sizes >= 1 joined by 'x' (e.g. 64 " "or 8x8)"
        )
    return shape


def _bytes(text: str) -> int:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (0 < v < 9.2e18) or v != int(v):
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of bytes > 0")
    return int(v)


def _fractions(text: str) -> list[float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects LOW,HIGH (e.g. 0,0.125), got '{text}'")
    return [low, high]


def plan_with_preset(argv: list[str]) -> int:
    from autoshard.planning.presets import PRESET_NAMES, PresetError, graph_options, resolve

    p = argparse.ArgumentParser(
        prog="autoshard plan",
        description="plan a traced graph under a preset's constraints "
        "(docs/presets.md); the other flags are those of `autoshard plan`",
    )
    p.add_argument("graph")
    p.add_argument("--preset", required=True, choices=PRESET_NAMES)
    p.add_argument("--mesh", required=True, type=_mesh)
    p.add_argument(
        "--dim-names", help="names joined by ',' (the preset needs them, e.g. " "dp,tp for fsdp+tp)"
    )
    p.add_argument("--hardware", default="H100")
    p.add_argument(
        "--param-memory",
        type=_fractions,
        help="LOW,HIGH: replaces the preset's parameter memory bounds",
    )
    p.add_argument("--memory-limit", type=_bytes)
    p.add_argument("--time-limit", type=float)
    p.add_argument("--max-problem-bytes", type=_bytes)
    p.add_argument("--out")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
    )
    names = [n.strip() for n in args.dim_names.split(",")] if args.dim_names else None
    try:
        if names and len(names) != len(args.mesh):
            raise PresetError(f"--dim-names: {len(names)} names for a {len(args.mesh)}-D mesh")
        preset = resolve(args.preset, args.mesh, names)
        _check_out(args.graph, args.out)
        from autoshard.planning.plan_layers import load_json, node_info

        graph = load_json(args.graph)
    except (PresetError, OSError, ValueError) as e:
        print(f"autoshard plan: {e}", file=sys.stderr)
        return 2 if isinstance(e, PresetError) else 1
    options = graph_options(
        preset,
        graph,
        PlannerOptions(
            mesh_shape=list(args.mesh),
            mesh_dim_names=names,
            hardware=args.hardware,
            verbose=args.verbose,
            memory_limit_bytes=args.memory_limit,
            time_limit_s=args.time_limit,
            max_problem_bytes=args.max_problem_bytes,
        ),
    )
    if args.param_memory:
        options.parameter_memory = tuple(args.param_memory)
    plan = _plan(graph, options, args.time_limit or DEFAULT_TIME_LIMIT_S)
    if isinstance(plan, str):
        print(f"autoshard plan: {plan}", file=sys.stderr)
        return 1
    sys.stdout.write(plan["report"])
    if args.out:
        saved = dict(plan, preset=args.preset, node_info=node_info(graph))
        with open(args.out, "w") as f:
            json.dump(saved, f, indent=1)
        print(f"plan written to {args.out}")
    return 0


def _plan(graph: dict, options: PlannerOptions, expected_s: float):
    """The plan dict, or the planner's error message."""
    from autoshard import progress

    try:
        with progress.stage("plan", expected_s=expected_s):
            plan = plan_graph(json.dumps(graph), options)
    except ValueError as e:
        return str(e)
    progress.log_solver_result(plan)
    return plan


def _check_out(graph_path: str, out: str | None) -> None:
    """As the C++ command does: refuse an --out that is the input, a directory, or in a
    directory that does not exist, before any work."""
    if not out:
        return
    if os.path.isdir(out):
        raise ValueError(f"--out {out}: is a directory")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ValueError(f"--out {out}: directory {parent} does not exist")
    if os.path.exists(out) and os.path.samefile(out, graph_path):
        raise ValueError(f"--out {out}: is the input graph file")
