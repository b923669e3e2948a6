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
import sys
import time

try:
    from autoshard.models import LlamaConfig
    from autoshard.pipeline.search import (
        GiB,
        TABLE_HEAD,
        Candidate,
        PricedCandidate,
        StageProfile,
        candidates,
        planner_profile,
        price,
        search,
        table_row,
    )
except ImportError as exc:  # pragma: no cover
    sys.exit(f"autoshard is not importable ({exc}); run: pip install --no-build-isolation -e .")


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


def profile(name: str, tp: int, seq: int, time_limit: float) -> StageProfile:
    return planner_profile(lambda n: llama3_config(name, n, seq), tp, seq, time_limit)


def run(name: str, args) -> None:
    n_layers, n_gpus, batch, recipe = MODELS[name]
    t0 = time.perf_counter()
    profiles = {tp: profile(name, tp, args.seq, args.time_limit) for tp in (1, 2, 4, 8)}
    limit = args.memory_limit_gib
    found = search(candidates(n_gpus, batch, n_layers), profiles, n_layers, limit * GiB)
    elapsed = time.perf_counter() - t0
    by_step = found.fitting()
    print(
        f"== Llama-3-{name.upper()}: {n_layers} layers, seq {args.seq}, global batch {batch} "
        f"sequences, {n_gpus} x H100 (8 per node), memory limit {limit:g} GiB; "
        f"{len(found.priced)} candidates priced in {elapsed:.1f} s "
        f"(stage profiles: {sum(p.plan_s for p in profiles.values()):.1f} s)\n"
    )
    print(TABLE_HEAD)
    pp, dp, tp, v = recipe
    titan = Candidate(pp, dp, tp, "Interleaved1F1B", v, batch // dp, "full", "step")
    rows = [("torchtitan-style", _priced(titan, profiles[tp], n_layers, limit))]
    if found.chosen:
        rows.insert(0, ("autoshard's choice", found.chosen))
    flat = [p for p in by_step if p.candidate.pp == 1]
    if flat:
        rows.append(("best without pipeline", flat[0]))
    else:  # none fits: the one nearest to fitting
        flat = sorted((p for p in found.priced if p.candidate.pp == 1), key=lambda p: p.peak_bytes)
        rows.append(("least memory without pipeline", flat[0]))
    for label, p in rows:
        print(table_row(label, p))
        if args.view:
            from autoshard.tools.pipeline_view import write_pipeline_view

            c, e = p.candidate, p.estimate
            stem = f"{name}-" + label.replace(" ", "_").replace("'", "")
            title = f"Llama-3-{name.upper()} {label}: pp={c.pp} dp={c.dp} tp={c.tp}"
            page, _ = write_pipeline_view(e, e["stages"], args.view, stem, title)
            print(f"  (wrote {page})")
    if args.top:
        print(f"\nthe {args.top} fastest that fit:")
        for p in by_step[: args.top]:
            print(table_row("", p))
    if not by_step:
        print("\nno candidate fits the memory limit")


def _priced(c: Candidate, prof: StageProfile, n_layers: int, limit_gib: float) -> PricedCandidate:
    e = price(c, prof, n_layers)
    peak = max(e["rank_peak_bytes"])
    return PricedCandidate(
        c, e["step_us"], e["bubble_fraction"], peak, e["peak_gib"] <= limit_gib, e
    )


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
