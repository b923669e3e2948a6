#!/usr/bin/env python3
"""On paper, one cost model: how to train Llama-3-405B on 512 H100s (or 70B on 256), every
mesh (pp x dp x tp, tp within a node), schedule (1F1B, Interleaved 1F1B with 2 or 4 stages
per rank; no pipeline), microbatch count and recomputation (none, full) priced by autoshard:
the best candidate, torchtitan's recipe (FSDP8 x TP8 x PP8, Interleaved 1F1B) and the best
plan without pipelining, side by side.

How a candidate is priced:
- A stage's per-microbatch cost comes from autoshard's planner: the model is traced with 2
  and with 3 layers for one sequence on the tp sub-mesh and planned there (the planner picks
  the layouts); the difference gives one layer's forward and backward time (compute +
  communication of its nodes), its saved activations and its parameter bytes per GPU; the
  embedding's nodes go to the first stage, the final norm, head and loss to the last.
- Layers are cut into stages by the cost model (``_core.balanced_split``), and the schedule's
  step is simulated over the stages (``_core.price_pipeline``: bubble, point-to-point sends
  over the link the pipeline dim crosses, per-rank activations in flight).
- Mixed precision with Adam: bf16 parameters (traced with a bf16 MixedPrecisionPolicy) and fp32 gradients
  as the stage computes; fp32 master parameters and two fp32 moments sharded over dp.
- Data parallelism (FSDP over dp), two ways: "step" gathers each stage's parameters once
  and holds them and the gradients for the step, reducing once at its end (torchtitan's
  setting with a pipeline); "microbatch" gathers per use and reduces after every
  microbatch's backward, holding only shards. The dp collectives are not hidden behind
  compute (an upper bound).
- Full recomputation keeps one layer input per microbatch and adds a forward to every
  backward.

    python bench/pipeline_plans.py                       # 405B on 512 and 70B on 256 GPUs
    python bench/pipeline_plans.py --models 70b --top 10 --view /tmp/pipelines
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field

try:
    from autoshard import _core
    from autoshard._testing.baselines import trace_llama
    from autoshard.models import LlamaConfig
except ImportError as exc:  # pragma: no cover
    sys.exit(f"autoshard is not importable ({exc}); run: pip install --no-build-isolation -e .")

GiB = 2**30


def llama3_config(name: str, n_layers: int, seq: int) -> LlamaConfig:
    dims = {  # dim, heads, kv heads, ffn
        "405b": (16384, 128, 8, 53248),
        "70b": (8192, 64, 8, 28672),
    }[name]
    dim, heads, kv, ffn = dims
    return LlamaConfig(
        dim=dim,
        n_layers=n_layers,
        n_heads=heads,
        n_kv_heads=kv,
        vocab_size=128256,
        ffn_dim=ffn,
        norm_eps=1e-5,
        rope_theta=500000.0,
        max_seq_len=seq,
        attention="sdpa",
    )


MODELS = {  # layers, GPUs, global batch (sequences), torchtitan-style recipe (pp, dp, tp, v)
    "405b": (126, 512, 2048, (8, 8, 8, 2)),
    "70b": (80, 256, 1024, (4, 8, 8, 2)),
}


@dataclass
class StageProfile:
    """One sequence's costs on the tp sub-mesh, from autoshard's plans."""

    tp: int
    layer_f_us: float
    layer_b_us: float
    layer_saved: int
    layer_params: int  # parameters per GPU of one layer (elements)
    first_f_us: float
    first_b_us: float
    last_f_us: float
    last_b_us: float
    extra_saved: int  # embedding, head and loss activations (on the last stage)
    extra_params: int
    layer_input_bytes: int
    plan_s: float = 0.0
    notes: list = field(default_factory=list)


def _plan(cfg, tp: int, time_limit: float) -> tuple[dict, dict]:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    traced = trace_llama(cfg, (tp,), ("tp",), batch=1, mp_policy=mp)
    # the layouts' own costs: memory is counted by the pipeline's pricing (recomputation is
    # a candidate's choice there), so the stage plan neither recomputes nor fits a limit
    options = {"mesh": {"shape": [tp], "dim_names": ["tp"]}, "hardware": "H100"}
    # identical layers share one layout, so that a layer costs the same in both traces
    options.update(
        time_limit_s=time_limit,
        recompute="none",
        memory_limit_bytes=10**18,
        repeated_layers="tie",
    )
    plan = json.loads(_core.plan_graph(traced.graph_json, json.dumps(options)))
    return json.loads(traced.graph_json), plan


def _costs_by_part(graph: dict, plan: dict) -> dict:
    """(part, phase) -> us: part 'layer' (all layers), 'first' (embedding), 'last' (the rest)."""
    out: dict = {}
    for n in graph["nodes"]:
        cost = plan["nodes"].get(n["name"], {})
        us = cost.get("compute_us", 0.0) + cost.get("comm_us", 0.0)
        # module paths may sit under a wrapper (the mixed-precision trace's "inner.")
        path = (n.get("module") or "").split(".")
        part = "layer" if "layers" in path else "first" if "tok_embeddings" in path else "last"
        key = (part, n.get("phase") or "forward")
        out[key] = out.get(key, 0.0) + us
    return out


def profile(name: str, tp: int, seq: int, time_limit: float) -> StageProfile:
    t0 = time.perf_counter()
    figures = {}
    for layers in (2, 3):
        graph, plan = _plan(llama3_config(name, layers, seq), tp, time_limit)
        figures[layers] = (_costs_by_part(graph, plan), plan["summary"]["memory"])
    c2, m2 = figures[2]
    c3, m3 = figures[3]
    cfg = llama3_config(name, 1, seq)
    saved = m3["saved_activations"] - m2["saved_activations"]
    params = (m3["parameters"] - m2["parameters"]) // 4  # fp32 parameters, bf16 compute
    return StageProfile(
        tp=tp,
        layer_f_us=c3.get(("layer", "forward"), 0) - c2.get(("layer", "forward"), 0),
        layer_b_us=c3.get(("layer", "backward"), 0) - c2.get(("layer", "backward"), 0),
        layer_saved=saved,
        layer_params=params,
        first_f_us=c2.get(("first", "forward"), 0),
        first_b_us=c2.get(("first", "backward"), 0),
        last_f_us=c2.get(("last", "forward"), 0),
        last_b_us=c2.get(("last", "backward"), 0),
        # what the 2-layer plan holds beyond two layers (never below 0: the two plans may
        # lay out the head differently)
        extra_saved=max(0, m2["saved_activations"] - 2 * saved),
        extra_params=max(0, m2["parameters"] // 4 - 2 * params),
        layer_input_bytes=seq * cfg.dim * 2,
        plan_s=time.perf_counter() - t0,
    )


@dataclass(frozen=True)
class Candidate:
    pp: int
    dp: int
    tp: int
    schedule: str
    virtual: int
    microbatches: int
    recompute: str
    fsdp: str  # "step": gathered once, held for the step; "microbatch": gathered per use


# bytes per parameter (mixed precision, Adam): bf16 parameters and fp32 gradients as the
# stage computes with them; fp32 master parameters and two fp32 moments, sharded over dp
HELD_BYTES, SHARDED_BYTES = 2 + 4, 4 + 8


def _stage_params(c: Candidate, prof: StageProfile, n_layers: int) -> list[tuple[int, dict]]:
    """(parameters per GPU, cost dict without resident bytes) of every stage."""
    n_stages = c.pp * c.virtual
    full = c.recompute == "full"
    f, b = prof.layer_f_us, prof.layer_b_us + (prof.layer_f_us if full else 0.0)
    saved = prof.layer_input_bytes if full else prof.layer_saved
    starts = _core.balanced_split(
        [f + b] * n_layers,
        n_stages,
        prof.first_f_us + prof.first_b_us,
        prof.last_f_us + prof.last_b_us,
    )
    bounds = list(starts) + [n_layers]
    out = []
    for s in range(n_stages):
        k = bounds[s + 1] - bounds[s]
        first, last = s == 0, s == n_stages - 1
        params = k * prof.layer_params + (prof.extra_params // 2 if first or last else 0)
        cost = {
            "forward_us": k * f
            + (prof.first_f_us if first else 0)
            + (prof.last_f_us if last else 0),
            "backward_us": k * b
            + (prof.first_b_us if first else 0)
            + (prof.last_b_us if last else 0),
            "saved_bytes": k * saved + (prof.extra_saved if last else 0),
            "send_bytes": prof.layer_input_bytes,
        }
        out.append((params, cost))
    return out


def _dp_us(c: Candidate, params: int) -> float:
    """A reduce-scatter of the gradients and an all-gather of the parameters over dp."""
    if c.dp == 1:
        return 0.0
    mesh = [c.pp, c.dp, c.tp]
    rs = _core.collective_time_us("reduce_scatter", 4.0 * params, "H100", mesh, 1)
    return rs + _core.collective_time_us("all_gather", 2.0 * params, "H100", mesh, 1)


def price(c: Candidate, prof: StageProfile, n_layers: int) -> dict:
    stages = []
    reduction = [0.0] * c.pp
    for s, (params, cost) in enumerate(_stage_params(c, prof, n_layers)):
        if c.fsdp == "step":  # held for the step, reduced once at its end
            cost["resident_bytes"] = HELD_BYTES * params + SHARDED_BYTES * params // c.dp
            reduction[s % c.pp] += _dp_us(c, params)
        else:  # gathered for each microbatch's forward and backward, reduced each backward
            cost["resident_bytes"] = (HELD_BYTES + SHARDED_BYTES) * params // c.dp
            cost["resident_bytes"] += HELD_BYTES * prof.layer_params  # one layer gathered
            per_mb = _dp_us(c, params)
            cost["forward_us"] += per_mb / 3
            cost["backward_us"] += 2 * per_mb / 3
        stages.append(cost)
    link = _core.mesh_dim_links("H100", [c.pp, c.dp, c.tp])[0]
    est = _core.price_pipeline(
        c.schedule, c.pp, c.microbatches, stages, link["bandwidth"], link["latency_us"], reduction
    )
    est["peak_gib"] = max(est["rank_peak_bytes"]) / GiB
    est["stages"] = stages
    return est


def candidates(n_gpus: int, batch: int, n_layers: int, tps=(1, 2, 4, 8)) -> list[Candidate]:
    out = []
    for tp in tps:
        for pp in (1, 2, 4, 8, 16, 32):
            if n_gpus % (pp * tp):
                continue
            dp = n_gpus // (pp * tp)
            if batch % dp:
                continue
            m = batch // dp  # microbatches of one sequence per dp rank
            if pp == 1:
                schedules = [("GPipe", 1)]  # no pipeline: gradient accumulation
            else:
                schedules = [("1F1B", 1)] + [
                    ("Interleaved1F1B", v) for v in (2, 4) if n_layers >= pp * v and m % pp == 0
                ]
            for sched, v in schedules:
                if m < pp:
                    continue
                for rc in ("none", "full"):
                    for fsdp in ("step", "microbatch"):
                        out.append(Candidate(pp, dp, tp, sched, v, m, rc, fsdp))
    return out


def _row(label: str, c: Candidate, est: dict, limit_gib: float) -> str:
    fits = "yes" if est["peak_gib"] <= limit_gib else "no"
    sched = c.schedule if c.pp > 1 else "none (accumulation)"
    if c.virtual > 1:
        sched += f" v={c.virtual}"
    return (
        f"| {label} | pp={c.pp} dp={c.dp} tp={c.tp} | {sched} | {c.microbatches} | "
        f"{c.recompute} | {c.fsdp} | {est['step_us'] / 1e3:,.0f} | {100 * est['bubble_fraction']:.1f} % | "
        f"{est['peak_gib']:.1f} | {fits} |"
    )


def run(name: str, args) -> None:
    n_layers, n_gpus, batch, recipe = MODELS[name]
    t0 = time.perf_counter()
    profiles = {tp: profile(name, tp, args.seq, args.time_limit) for tp in (1, 2, 4, 8)}
    cands = candidates(n_gpus, batch, n_layers)
    priced = [(c, price(c, profiles[c.tp], n_layers)) for c in cands]
    elapsed = time.perf_counter() - t0
    limit = args.memory_limit_gib
    fitting = [(c, e) for c, e in priced if e["peak_gib"] <= limit]
    by_step = sorted(fitting, key=lambda x: x[1]["step_us"])
    print(
        f"== Llama-3-{name.upper()}: {n_layers} layers, seq {args.seq}, global batch {batch} "
        f"sequences, {n_gpus} x H100 (8 per node), memory limit {limit:g} GiB; "
        f"{len(priced)} candidates priced in {elapsed:.1f} s "
        f"(stage profiles: {sum(p.plan_s for p in profiles.values()):.1f} s)\n"
    )
    print(
        "| | mesh | schedule | microbatches | recompute | FSDP gathers | step (ms) | bubble "
        "| peak GiB | fits |"
    )
    print("|---|---|---|---:|---|---|---:|---:|---:|---|")
    pp, dp, tp, v = recipe
    titan = Candidate(pp, dp, tp, "Interleaved1F1B", v, batch // dp, "full", "step")
    rows = [("torchtitan-style", titan, price(titan, profiles[tp], n_layers))]
    if by_step:
        rows.insert(0, ("autoshard's choice", *by_step[0]))
    flat = [x for x in by_step if x[0].pp == 1]
    if flat:
        rows.append(("best without pipeline", *flat[0]))
    else:  # none fits: the one nearest to fitting
        flat = sorted((x for x in priced if x[0].pp == 1), key=lambda x: x[1]["peak_gib"])
        rows.append(("least memory without pipeline", *flat[0]))
    for label, c, e in rows:
        print(_row(label, c, e, limit))
        if args.view:
            from autoshard.tools.pipeline_view import write_pipeline_view

            stem = f"{name}-" + label.replace(" ", "_").replace("'", "")
            title = f"Llama-3-{name.upper()} {label}: pp={c.pp} dp={c.dp} tp={c.tp}"
            page, _ = write_pipeline_view(e, e["stages"], args.view, stem, title)
            print(f"  (wrote {page})")
    if args.top:
        print(f"\nthe {args.top} fastest that fit:")
        for c, e in by_step[: args.top]:
            print(_row("", c, e, limit))
    if not by_step:
        print("\nno candidate fits the memory limit")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="405b,70b")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--memory-limit-gib", type=float, default=72.0)
    p.add_argument("--time-limit", type=float, default=5.0, help="solver limit per stage plan")
    p.add_argument("--top", type=int, default=0)
    p.add_argument("--view", metavar="DIR", help="write each row's timeline and stages there")
    args = p.parse_args(argv)
    for name in args.models.split(","):
        if name not in MODELS:
            p.error(f"--models: unknown {name!r}; known: {', '.join(MODELS)}")
        run(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
