#!/usr/bin/env python3
"""On paper: long-context training of Llama-3-8B on a virtual GPU cluster, the plans autoshard
makes with the sequence split over a ``cp`` mesh dim against the best plan without one.

Each candidate mesh is traced (meta device, fake process group, bf16 parameters with fp32
gradient reduction) and planned by autoshard with the H100 profile and its memory limit
(recomputation chosen by the planner where the limit needs it). Candidates:

- the planner's choice: the tokens ``Shard(1)`` over ``cp`` and every layout free
  (attention's sequence row, q sharded and k / v gathered, among its rows);
- with a sequence split: attention pinned to its sequence row on ``cp`` (heads on ``tp``);
- without: the tokens split over the batch only and attention pinned to its batch / head
  rows (heads over ``tp``), so no tensor is split along the sequence inside attention (the
  planner may still shard elsewhere as it likes).

Printed: each candidate's predicted step, exposed communication, peak memory per GPU,
whether it fits, the recomputation the planner added and the attention layout it chose;
then the best plan with a sequence split against the best without.

    python3 bench/long_context_plans.py                    # Llama-3-8B, seq 131,072, 64 GPUs
    python3 bench/long_context_plans.py --layers 4 --seq 32768
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

# (name, mesh shape, dim names, input layout per dim: "batch" | "seq" | "rep", attention:
# None = the planner's choice, "seq" = pinned to its sequence row on cp (heads on tp),
# "heads" = pinned to its batch / head rows)
CANDIDATES = (
    ("dp8 x cp8", (8, 8), ("dp", "cp"), ("batch", "seq"), None),
    ("dp8 x cp8", (8, 8), ("dp", "cp"), ("batch", "seq"), "seq"),
    # cp 16: what the planner picks where the cp dim is larger (32 heads after GQA's repeat)
    ("dp4 x cp16", (4, 16), ("dp", "cp"), ("batch", "seq"), None),
    ("dp4 x cp16", (4, 16), ("dp", "cp"), ("batch", "seq"), "seq"),
    ("dp2 x cp32", (2, 32), ("dp", "cp"), ("batch", "seq"), "seq"),
    ("dp8 x tp8", (8, 8), ("dp", "tp"), ("batch", "rep"), "heads"),
    ("dp4 x tp16", (4, 16), ("dp", "tp"), ("batch", "rep"), "heads"),
)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--seq", type=int, default=131072)
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")
    p.add_argument("--hardware", default="H100")
    p.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per plan")
    return p.parse_args(argv)


def _layout(kinds: tuple[str, ...]) -> tuple:
    from torch.distributed.tensor import Replicate, Shard

    return tuple({"batch": Shard(0), "seq": Shard(1), "rep": Replicate()}[k] for k in kinds)


def _pin_attention(autop, names: tuple[str, ...], row: str) -> None:
    """Attention's batch row on the dp dims, its head row on ``tp`` and, for ``row="seq"``,
    its sequence row on ``cp``."""
    from torch.distributed.tensor import Replicate, Shard

    dims = {"dp": Shard(0), "tp": Shard(1), "cp": Shard(2) if row == "seq" else Replicate()}
    layout = tuple(dims[n] for n in names)
    for n in autop.gm.graph.nodes:
        if "scaled_dot_product" in str(n.target):
            autop.add_node_constraint(n.name, layout)


def _attention_row(plan: dict) -> str:
    """The attention forward's query layout in the plan (e.g. ``S(0),S(2)``)."""
    for name, entry in plan["nodes"].items():
        if "scaled_dot_product" in name and "backward" not in name:
            return ",".join(entry["inputs"][0])
    return "-"


def plan_candidate(a, cfg, shape, names, kinds, pin: str | None) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from autoshard import AutoParallel
    from autoshard.models import Llama
    from autoshard.trace.fake_pg import fake_world

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    t0 = time.perf_counter()
    with fake_world(shape, names, device_type="cuda") as mesh:
        with torch.device("meta"):
            model = Llama(cfg)
        sample = lambda: tuple(torch.zeros(a.batch, a.seq, dtype=torch.long) for _ in range(2))
        with AutoParallel(
            model,
            sample,
            mesh,
            mp_policy=mp,
            hardware=a.hardware,
            time_limit_s=a.time_limit,
            plan_cache=False,
        ) as autop:
            autop.add_input_constraints([_layout(kinds)] * 2)
            if pin is not None:
                _pin_attention(autop, names, pin)
            result = autop.optimize_placement()
            summary = autop.sharding_optimizer.get_json()["summary"]
    recompute = summary.get("recompute") or {}
    return {
        "step_s": summary["total_us"] / 1e6,
        "exposed_comm_s": summary["exposed_comm_us"] / 1e6,
        "peak_gib": summary["memory"]["peak_bytes"] / 2**30,
        "fits": bool(recompute.get("fits", True)),
        "recompute_s": recompute.get("added_us", 0.0) / 1e6,
        "attention": _attention_row(result.plan),
        "plan_s": time.perf_counter() - t0,
    }


def main(argv=None) -> int:
    from autoshard.models import llama3_8b_config

    a = parse(argv)
    cfg = dataclasses.replace(llama3_8b_config(n_layers=a.layers, seq_len=a.seq), attention="sdpa")
    gpus = {torch.Size(shape).numel() for _, shape, *_ in CANDIDATES}
    print(
        f"Llama-3-8B ({a.layers} layers), seq {a.seq:,}, global batch {a.batch} sequences, "
        f"{'/'.join(map(str, sorted(gpus)))} x {a.hardware}, bf16 parameters, fp32 reduction\n"
    )
    print(
        "| mesh | attention | step (s) | exposed comm (s) | peak GiB | fits | recompute (s) "
        "| attention q | plan (s) |"
    )
    print("|---|---|---:|---:|---:|---|---:|---|---:|")
    rows = []
    for name, shape, names, kinds, pin in CANDIDATES:
        r = plan_candidate(a, cfg, shape, names, kinds, pin)
        rows.append((name, pin, r))
        print(
            f"| {name} | {pin or 'planner'} | {r['step_s']:.2f} | {r['exposed_comm_s']:.2f} | {r['peak_gib']:.1f} "
            f"| {'yes' if r['fits'] else 'no'} | {r['recompute_s']:.2f} | {r['attention']} "
            f"| {r['plan_s']:.1f} |",
            flush=True,
        )

    def best(seq_split: bool):
        """The fastest fitting plan whose attention splits the sequence (q S(2)) or not."""
        fitting = [
            (f"{n} ({pin or 'planner'})", r)
            for n, pin, r in rows
            if r["fits"] and ("S(2)" in r["attention"]) == seq_split
        ]
        return min(fitting, key=lambda nr: nr[1]["step_s"]) if fitting else None

    print()
    for n, pin, r in rows:
        if pin is None:
            print(f"autoshard's choice on {n}: attention q {r['attention']}, {r['step_s']:.2f} s")
    with_cp, without = best(True), best(False)
    for label, choice in (("with a sequence split", with_cp), ("without", without)):
        text = f"{choice[0]}, {choice[1]['step_s']:.2f} s" if choice else "none fits"
        print(f"best plan {label}: {text}")
    if with_cp and without:
        print(f"ratio (with / without): {with_cp[1]['step_s'] / without[1]['step_s']:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
