#!/usr/bin/env python3
"""Plan Llama-3-8B on (dp=8, tp=8) and Llama-3-70B on (dp=32, tp=8) H100s, and compare each
plan with the Megatron-style baseline (autoshard._testing.baselines) under the same cost model.

The model is built on the meta device and one training step is traced on a fake process
group (no GPU, no collectives). Per model it prints: graph nodes, ops without a sharding
rule (must be none), trace time, plan time, the step-time estimate split into compute and
communication, parameter memory per GPU, and the Megatron baseline's figures.

    python bench/llama_plans.py                        # both models
    python bench/llama_plans.py --models 8b            # one of them
    python bench/llama_plans.py --layers 4             # fewer layers (quick check)
    python bench/llama_plans.py --time-limit 60 --memory-limit-gb 80

Both plans get the same mesh, hardware, inputs (batch on dp), memory limit and parameter-
memory budget (the Megatron plan's own bytes per GPU), so autoshard's search space contains
the Megatron plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

try:
    from autoshard import _core
    from autoshard._testing.baselines import TracedGraph, compare_with_megatron, trace_llama
    from autoshard.models import LlamaConfig, llama3_8b_config
    from autoshard.planning.plan import Plan
except ImportError as exc:  # pragma: no cover
    sys.exit(f"autoshard is not importable ({exc}); run: pip install --no-build-isolation -e .")


def llama3_70b_config(n_layers: int = 80, seq_len: int = 2048) -> LlamaConfig:
    """Llama-3-70B: dim 8192, 64 heads, 8 KV heads, ffn 28672, vocab 128256."""
    return LlamaConfig(
        dim=8192,
        n_layers=n_layers,
        n_heads=64,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_dim=28672,
        norm_eps=1e-5,
        rope_theta=500000.0,
        max_seq_len=seq_len,
        attention="sdpa",
    )


def llama_parameters(cfg: LlamaConfig) -> int:
    """Parameter count of autoshard.models.Llama(cfg), by hand."""
    head = cfg.dim // cfg.n_heads
    attn = cfg.dim * cfg.dim * 2 + 2 * cfg.dim * cfg.n_kv_heads * head
    layer = attn + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim
    return cfg.n_layers * layer + 2 * cfg.vocab_size * cfg.dim + cfg.dim


@dataclass(frozen=True)
class Case:
    name: str
    config: LlamaConfig
    mesh: tuple[int, int]
    batch_per_dp: int


def cases(args) -> list[Case]:
    out = []
    for m in args.models.split(","):
        m = m.strip().lower()
        if m == "8b":
            cfg = llama3_8b_config(n_layers=args.layers or 32, seq_len=args.seq)
            out.append(Case("Llama-3-8B", cfg, (8, 8), args.batch_per_dp))
        elif m == "70b":
            cfg = llama3_70b_config(n_layers=args.layers or 80, seq_len=args.seq)
            out.append(Case("Llama-3-70B", cfg, (32, 8), args.batch_per_dp))
        else:
            raise SystemExit(f"--models: unknown model {m!r} (expected 8b, 70b)")
    return out


def _recompute_us(plan: dict) -> float:
    """The time the plan's recomputation adds to its step (docs/cost_model.md 6b)."""
    return Plan.from_json(plan).summary.recompute.added_us


def ops_without_rules(graph_json: str) -> list[str]:
    """The ops of the graph that have no sharding rule (checked on a 1-device mesh, where the
    rule lookup is the same and the strategy lists are short)."""
    opts = json.dumps({"mesh": {"shape": [1]}})
    result = json.loads(_core.enumerate_strategies(graph_json, opts, True))
    return sorted({u["op"] for u in result["unsupported"]})


def run_case(case: Case, args) -> dict:
    cfg = case.config
    dp, tp = case.mesh
    batch = case.batch_per_dp * dp
    print(
        f"== {case.name}: {cfg.n_layers} layers, dim {cfg.dim}, {cfg.n_heads} heads "
        f"({cfg.n_kv_heads} kv), ffn {cfg.ffn_dim}, vocab {cfg.vocab_size}; batch {batch} x "
        f"seq {cfg.max_seq_len}; mesh (dp={dp}, tp={tp}) = {dp * tp} x {args.hardware}",
        flush=True,
    )
    cache = None
    if args.graph_cache:
        cache = os.path.join(
            args.graph_cache,
            f"{case.name}-{cfg.n_layers}l-{dp}x{tp}-b{batch}-" f"s{cfg.max_seq_len}.json",
        )
    if cache and os.path.exists(cache):
        with open(cache) as f:
            text = f.read()
        traced = TracedGraph(text, float("nan"), -1, llama_parameters(cfg))
        print(f"  (graph read from {cache}; trace time not measured)")
    else:
        traced = trace_llama(cfg, case.mesh, batch=batch)
        if cache:
            os.makedirs(args.graph_cache, exist_ok=True)
            with open(cache, "w") as f:
                f.write(traced.graph_json)
    graph_nodes = len(json.loads(traced.graph_json)["nodes"])
    print(f"  parameters          {traced.parameters / 1e9:.2f} B")
    aten = f"{traced.aten_nodes} ATen ops in the joint graph, " if traced.aten_nodes >= 0 else ""
    print(
        f"  nodes               {aten}{graph_nodes} planner graph nodes (placeholders "
        f"included, getitems folded)"
    )
    if traced.trace_seconds == traced.trace_seconds:  # not NaN: traced in this run
        print(f"  trace time          {traced.trace_seconds:.1f} s", flush=True)
    missing = ops_without_rules(traced.graph_json)
    print(f"  ops without rules   {', '.join(missing) if missing else 'none'}", flush=True)
    if missing:
        return {"model": case.name, "ops_without_rules": missing}
    memory = int(args.memory_limit_gb * 1e9) if args.memory_limit_gb > 0 else None
    t0 = time.perf_counter()
    c = compare_with_megatron(
        traced.graph_json,
        case.mesh,
        hardware=args.hardware,
        memory_limit_bytes=memory,
        time_limit_s=args.time_limit,
        recompute=args.recompute,
    )
    a, m = c.autoshard, c.megatron
    print(f"  plan time           {a.plan_seconds:.1f} s (solver limit {args.time_limit:g} s)")
    print(
        f"  step time estimate  {a.total_us / 1e3:.2f} ms = compute {a.compute_us / 1e3:.2f} ms "
        f"+ exposed comm {a.exposed_comm_us / 1e3:.2f} ms (of {a.comm_us / 1e3:.2f} ms; "
        f"{100 * a.exposed_comm_us / a.total_us:.0f}% of the step); "
        f"lower bound {a.lower_bound_us / 1e3:.2f} ms"
    )
    print(f"  parameters per GPU  {a.parameter_bytes_per_gpu / 2**30:.3f} GiB")
    summary = Plan.from_json(a.plan).summary
    print(f"  {summary.memory.describe()}")
    print(f"  {summary.recompute.describe()} (fits the limit: {summary.recompute.fits})")
    for label, v in c.variants.items():
        print(
            f"  Megatron [{label:<8}] {v.total_us / 1e3:.2f} ms = compute "
            f"{v.compute_us / 1e3:.2f} ms + exposed comm {v.exposed_comm_us / 1e3:.2f} ms "
            f"(of {v.comm_us / 1e3:.2f} ms) + recompute {_recompute_us(v.plan) / 1e3:.2f} ms; "
            f"parameters {v.parameter_bytes_per_gpu / 2**30:.3f} GiB/GPU; planned in "
            f"{v.plan_seconds:.1f} s"
        )
    # the steps compared with what each recomputes to fit the same memory limit
    mine, theirs = a.total_us + _recompute_us(a.plan), m.total_us + _recompute_us(m.plan)
    print(
        f"  autoshard vs best Megatron (recomputation included: {mine / 1e3:.2f} ms vs "
        f"{theirs / 1e3:.2f} ms): {100 * (theirs - mine) / theirs:+.2f}% "
        f"(positive: autoshard faster); all plans in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    if args.verbose:
        print(a.plan.get("report", ""))
        print(m.plan.get("report", ""))
    return {
        "model": case.name,
        "mesh": list(case.mesh),
        "layers": cfg.n_layers,
        "batch": batch,
        "seq": cfg.max_seq_len,
        "aten_nodes": traced.aten_nodes,
        "graph_nodes": graph_nodes,
        "trace_s": traced.trace_seconds,
        "plan_s": a.plan_seconds,
        "ops_without_rules": missing,
        "autoshard": {
            k: getattr(a, k)
            for k in (
                "total_us",
                "compute_us",
                "comm_us",
                "exposed_comm_us",
                "parameter_bytes_per_gpu",
                "lower_bound_us",
            )
        },
        "megatron": {
            label: {
                k: getattr(v, k)
                for k in (
                    "total_us",
                    "compute_us",
                    "comm_us",
                    "exposed_comm_us",
                    "parameter_bytes_per_gpu",
                    "plan_seconds",
                )
            }
            for label, v in c.variants.items()
        },
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="8b,70b", help="comma list of 8b, 70b (default both)")
    p.add_argument(
        "--layers",
        type=int,
        default=0,
        help="override the layer count (default: 32 for 8B, 80 for 70B)",
    )
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--batch-per-dp", type=int, default=8, help="sequences per dp rank (default 8)")
    p.add_argument("--hardware", default="H100")
    p.add_argument(
        "--time-limit",
        type=float,
        default=30.0,
        help="solver time limit per plan in seconds (default 30)",
    )
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=80.0,
        help="memory limit per GPU in GB (1e9 bytes; default 80, 0: none)",
    )
    p.add_argument(
        "--recompute",
        choices=("auto", "none", "selective", "full"),
        help="what the backward may recompute to fit the memory limit (default: the "
        "planner's, auto: only what the limit needs; none: the plan without recomputation)",
    )
    p.add_argument("--json-out", help="also write the figures as JSON to this file")
    p.add_argument(
        "--graph-cache",
        help="directory to keep traced graphs in: a graph found "
        "there is read instead of traced (its trace time is then not measured)",
    )
    p.add_argument("--verbose", action="store_true", help="print both plans' reports")
    args = p.parse_args(argv)
    results = []
    for case in cases(args):
        try:
            results.append(run_case(case, args))
        except ValueError as e:  # the planner's message names the constraint to relax
            print(f"  planning failed: {e}", flush=True)
            results.append({"model": case.name, "error": str(e)})
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all("error" not in r and not r.get("ops_without_rules") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
