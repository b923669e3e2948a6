"""`autoshard demo`: plan a Llama-3-8B-shaped model on a virtual 64-GPU cluster.

The model is built on the meta device, one training step is traced (joint forward +
backward, global shapes), and the C++ planner chooses every tensor's layout on a
dp x tp mesh of a fake process group: no GPU and no real cluster needed. Prints the plan
summary per layer (the layout of each weight and activation), compute vs communication
time and parameter memory per GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from contextlib import ExitStack

import torch

from autoshard.planning.plan_layers import layer_of
from autoshard.planning.presets import PRESET_NAMES, PresetError, default_dim_names, resolve


def _parse_mesh(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.lower().replace("*", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mesh: expected sizes like 8x8, got {text!r}")
    if not shape or any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(f"--mesh: sizes must be >= 1, got {text!r}")
    return shape


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoshard demo", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32, help="transformer layers (default 32)")
    p.add_argument(
        "--mesh",
        type=_parse_mesh,
        default=(8, 8),
        help="mesh shape, dp x tp (default 8x8 = 64 GPUs)",
    )
    p.add_argument("--hardware", default="H100", help="GPU profile (default H100)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument(
        "--batch-per-dp", type=int, default=8, help="sequences per data-parallel rank (default 8)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=None,
        help="global batch in sequences (default: --batch-per-dp x the data-"
        "parallel size, the mesh size without its tp dim)",
    )
    p.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default=None,
        help="plan under a preset's constraints (docs/presets.md) instead of the "
        "demo's own (batch split over dp, 1/mesh size of the parameters)",
    )
    p.add_argument(
        "--dim-names",
        default=None,
        help="mesh dim names joined by ',' (default dp,tp; with --preset, names "
        "that fit it, e.g. dp_replicate,dp_shard for hsdp)",
    )
    p.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa")
    p.add_argument(
        "--time-limit", type=float, default=10.0, help="solver time limit in seconds (default 10)"
    )
    p.add_argument("--trace-only", action="store_true", help="stop after tracing")
    p.add_argument("--graph-out", help="also write the traced graph JSON to this file")
    p.add_argument("--plan-out", help="also write the plan JSON to this file")
    p.add_argument("--verbose", action="store_true", help="log every node of the plan")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.layers < 1:
        print("autoshard demo: --layers must be >= 1", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s"
    )
    from torch.distributed.tensor import Replicate, Shard

    from autoshard.api.autoparallel import AutoParallel
    from autoshard.trace.fake_pg import fake_world
    from autoshard.models import Llama, llama3_8b_config

    mesh_shape = args.mesh
    if args.dim_names:
        names = tuple(n.strip() for n in args.dim_names.split(","))
    elif args.preset:
        names = default_dim_names(args.preset, len(mesh_shape))
    else:
        names = (
            ("dp", "tp") if len(mesh_shape) == 2 else tuple(f"d{i}" for i in range(len(mesh_shape)))
        )
    if len(names) != len(mesh_shape):
        print(
            f"autoshard demo: --dim-names: {len(names)} names for a {len(mesh_shape)}-D " "mesh",
            file=sys.stderr,
        )
        return 2
    try:
        resolve(args.preset, mesh_shape, names)
    except PresetError as e:
        print(f"autoshard demo: {e}", file=sys.stderr)
        return 2
    cfg = llama3_8b_config(n_layers=args.layers, seq_len=args.seq)
    if args.attention != cfg.attention:
        from dataclasses import replace

        cfg = replace(cfg, attention=args.attention)
    dp = mesh_shape[0]  # the demo's own constraints split the batch over mesh dim 0
    if args.preset:  # a preset splits it over every dim but tp
        dp = 1
        for size, name in zip(mesh_shape, names):
            dp *= 1 if name == "tp" else size
    batch = args.batch if args.batch else args.batch_per_dp * dp
    t_start = time.perf_counter()
    with torch.device("meta"):
        model = Llama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Llama-3-8B shape, {args.layers} layers, {n_params / 1e9:.2f} B parameters;"
        f" batch {batch} x seq {args.seq}; mesh {'x'.join(map(str, mesh_shape))} "
        f"({'/'.join(names)}) = {torch.Size(mesh_shape).numel()} x {args.hardware}"
        + (f"; preset {args.preset}" if args.preset else "")
    )

    def input_fn():
        tokens = torch.empty(batch, args.seq, dtype=torch.long)
        return tokens, torch.empty(batch, args.seq, dtype=torch.long)

    with fake_world(mesh_shape, names) as mesh, ExitStack() as scope:
        autop = scope.enter_context(
            AutoParallel(  # logs its stages (progress.py)
                model,
                input_fn,
                mesh,
                hardware=args.hardware,
                time_limit_s=args.time_limit,
                preset=args.preset,
            )
        )
        step = autop.step
        n_nodes = sum(1 for n in step.gm.graph.nodes if n.op == "call_function")
        print(
            f"traced: {n_nodes} ATen nodes in {step.trace_seconds:.1f} s "
            f"(source lines {'recorded' if step.source_captured else 'absent'})"
        )
        if args.graph_out:
            with open(args.graph_out, "w") as f:
                f.write(autop.graph_json())
        if args.trace_only:
            return 0
        if not args.preset:  # a preset has added its own
            batch_sharded = (Shard(0),) + (Replicate(),) * (len(mesh_shape) - 1)
            autop.add_input_constraints([batch_sharded, batch_sharded])
            autop.add_parameter_memory_constraint()
        autop.add_output_constraints([(Replicate(),) * len(mesh_shape)])
        try:
            plan = autop.optimize_placement(verbose=args.verbose)
        except NotImplementedError as e:
            print(f"planning unavailable: {e}")
            return 0
        except ValueError as e:  # the planner's message says what to relax
            print(f"autoshard demo: planning failed: {e}", file=sys.stderr)
            return 1
        if args.plan_out:
            from autoshard.planning.plan_layers import node_info

            # the plan with each node's op, module and shapes, for `autoshard view`
            saved = dict(autop.plan, node_info=node_info(json.loads(autop.graph_json())))
            if args.preset:
                saved["preset"] = args.preset
            with open(args.plan_out, "w") as f:
                json.dump(saved, f)
        print(summarize_plan(plan, step))
    print(
        f"total demo time {time.perf_counter() - t_start:.1f} s "
        f"(planning {plan.get('plan_seconds', 0.0):.1f} s)"
    )
    return 0


def summarize_plan(plan_json: dict, step) -> str:
    """Per layer: each weight's at-rest layout and the layouts of the forward activations of
    its matmuls; then totals."""
    from autoshard.user_frames import module_path
    from autoshard.planning.plan import NodePlan, Plan

    plan = Plan.from_json(plan_json)
    none = NodePlan(outputs=[], inputs=[])
    lines = []
    by_layer: dict[str, list[str]] = defaultdict(list)

    for ph, fqn in step.param_fqns.items():
        out = plan.nodes.get(ph, none).output
        by_layer[layer_of(fqn)].append(f"  {fqn:<42} {_fmt(out)}")
    acts: dict[str, list[str]] = defaultdict(list)
    runs_in = step.schedule.runs_in
    for n in step.gm.graph.nodes:
        if n.op != "call_function" or runs_in[n.name] != "forward":
            continue
        if str(n.target) not in (
            "aten.mm.default",
            "aten.bmm.default",
            "aten._scaled_dot_product_flash_attention.default",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten.embedding.default",
        ):
            continue
        mod = module_path(n) or ""
        e = plan.nodes.get(n.name, none)
        acts[layer_of(mod) if mod else "-"].append(
            f"  {n.name:<14} {str(n.target).split('.')[1]:<14} {mod:<34} "
            f"in {' '.join(_fmt(i) for i in e.inputs)} -> {_fmt(e.output)}"
        )
    shown = 0
    ordered = sorted(by_layer, key=_layer_key)
    last_layer = max((l for l in ordered if l.startswith("layers.")), key=_layer_key, default=None)
    for layer in ordered:
        if layer.startswith("layers.") and shown >= 2 and layer != last_layer:
            continue  # the repeated layers look alike; print the first two and the last
        if layer.startswith("layers."):
            shown += 1
        lines.append(f"{layer}:")
        lines.extend(by_layer[layer])
        lines.extend(acts.get(layer, []))
    s = plan.summary
    total, comm, exposed, compute = s.total_us, s.comm_us, s.exposed_comm_us, s.compute_us
    lines.append(
        f"step time (model): {total / 1e3:.2f} ms = compute {compute / 1e3:.2f} ms + "
        f"exposed communication {exposed / 1e3:.2f} ms "
        f"({100 * exposed / total if total else 0:.0f}%; {comm / 1e3:.2f} ms in all)"
        f"; lower bound {s.lower_bound_us / 1e3:.2f} ms"
    )
    lines.append(f"parameter memory per GPU: {s.parameter_bytes_per_gpu / 2**30:.2f} GiB")
    if plan.report:
        lines.append("")
        lines.append(plan.report.rstrip())
    return "\n".join(lines)


def _layer_key(name: str):
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
        return (1, int(parts[1]), "")
    return (0 if name == "tok_embeddings" else 2, 0, name)


def _fmt(layout) -> str:
    return "(" + ",".join(layout) + ")" if layout else "-"


if __name__ == "__main__":
    sys.exit(main())
