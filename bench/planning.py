#!/usr/bin/env python3
"""Planning time per stage and peak memory: the whole ``optimize_placement`` path a user runs,
on virtual meshes (fake process group), one case per process so peak RSS is the case's own.

Per case it prints: joint-graph nodes, trace time (joint graph + export, from the model the
user built on the meta device; wall clock, and the process's CPU time, which a machine shared
with other jobs inflates less), plan time (strategies + problem build + solve + report, as
``optimize_placement`` returns it), the solver's own time, the plan's cost and its gap to the
solver's lower bound, and the process's peak RSS. The plan cache is off (a hit would measure
the cache, not the planner). Targets (issue 9; this 2-core machine): small models (< 1,000
nodes) <= 2 s in all, Llama-3-8B 32 layers seq 8192 on 8x8 <= 10 s and <= 2 GB, Llama-3-70B on 32x8 <= 20 s,
Llama-3-405B on a 3-D mesh <= 60 s, a DeepSeek-style MoE on a 2-D mesh <= 30 s, every gap
<= 1 %.

    python3 bench/planning.py                       # the quick cases
    python3 bench/planning.py --cases all           # also the 70B and 405B ones (minutes)
    python3 bench/planning.py --cases llama8b --time-limit 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

from autoshard.planning.options import DEFAULT_TIME_LIMIT_S

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Case:
    name: str
    mesh: tuple
    dim_names: tuple
    quick: bool = True
    bf16: bool = False  # plan under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)


CASES = {
    "tiny_llama": Case("step_time.py's Llama-style model, dim 128, 2 layers", (2,), ("dp",)),
    "tiny_llama_8x8": Case("the same on 8x8", (8, 8), ("dp", "tp")),
    "gpt2_tiny": Case("transformers GPT-2, 2 layers, dim 64", (8, 8), ("dp", "tp")),
    "moe_block": Case("MoE block (models_zoo.MoEBlock), 8 experts", (8, 8), ("dp", "ep")),
    "deepseek_moe": Case(
        "DeepSeek-style MoE (models_zoo.DeepSeekMoEBlock), 8 layers, dim 2048, "
        "64 experts of 1408, top-6, shared expert 2816, 64x512 tokens",
        (8, 8),
        ("dp", "ep"),
    ),
    "llama8b_2l": Case("Llama-3-8B shape, 2 layers, seq 2048", (8, 8), ("dp", "tp")),
    "llama8b": Case("Llama-3-8B, 32 layers, seq 8192", (8, 8), ("dp", "tp")),
    "hf_llama8b": Case(
        "transformers LlamaForCausalLM, Llama-3-8B config, 32 layers, seq 8192",
        (8, 8),
        ("dp", "tp"),
    ),
    "hf_llama8b_bf16": Case(
        "the same under a bf16 mixed-precision policy", (8, 8), ("dp", "tp"), quick=False, bf16=True
    ),
    "llama70b": Case("Llama-3-70B, 80 layers, seq 2048", (32, 8), ("dp", "tp"), quick=False),
    "llama405b": Case(
        "Llama-3-405B, 126 layers, seq 2048", (16, 8, 8), ("dp", "tp", "cp"), quick=False
    ),
}


def _model_and_inputs(key: str):
    """(meta model, input_fn) of a case."""
    import torch

    from autoshard.models import LlamaConfig, Llama, llama3_8b_config

    long = lambda *shape: torch.empty(shape, dtype=torch.long)  # noqa: E731
    with torch.device("meta"):
        if key.startswith("tiny_llama"):
            sys.path.insert(0, HERE)
            from step_time import make_model

            a = argparse.Namespace(vocab=512, dim=128, layers=2, heads=4, kv_heads=2, hidden=512)
            return make_model(a), lambda: (long(8, 64), long(8, 64))
        if key == "gpt2_tiny":
            from autoshard._testing.models_zoo import GPT2LM

            return GPT2LM(dropout=0.0), lambda: (long(64, 32), long(64, 32))
        if key == "moe_block":
            from autoshard._testing.models_zoo import MoEBlock

            return MoEBlock(dim=64, hidden=96, n_experts=8), lambda: (
                torch.empty(64, 16, 64),
                torch.empty(64, 16, 64),
            )
        if key == "deepseek_moe":
            from autoshard._testing.models_zoo import DeepSeekMoEBlock

            return DeepSeekMoEBlock(
                dim=2048, hidden=1408, n_experts=64, top_k=6, shared_hidden=2816, n_layers=8
            ), lambda: (torch.empty(64, 512, 2048), torch.empty(64, 512, 2048))
        if key.startswith("hf_llama8b"):
            import transformers

            from autoshard._testing.hf_zoo import LossOf

            hf = transformers.LlamaConfig(
                hidden_size=4096,
                intermediate_size=14336,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                vocab_size=128256,
                max_position_embeddings=8192,
                rope_theta=500000.0,
                tie_word_embeddings=False,
            )
            model = LossOf(transformers.LlamaForCausalLM(hf), ("input_ids", "labels"))
            return model, lambda: (long(64, 8192), long(64, 8192))
        cfg = {
            "llama8b_2l": lambda: llama3_8b_config(n_layers=2, seq_len=2048),
            "llama8b": lambda: llama3_8b_config(n_layers=32, seq_len=8192),
            "llama70b": lambda: LlamaConfig(
                dim=8192,
                n_layers=80,
                n_heads=64,
                n_kv_heads=8,
                vocab_size=128256,
                ffn_dim=28672,
                max_seq_len=2048,
            ),
            "llama405b": lambda: LlamaConfig(
                dim=16384,
                n_layers=126,
                n_heads=128,
                n_kv_heads=8,
                vocab_size=128256,
                ffn_dim=53248,
                max_seq_len=2048,
            ),
        }[key]()
        batch = 8 * CASES[key].mesh[0]
        seq = cfg.max_seq_len
        return Llama(cfg), lambda: (long(batch, seq), long(batch, seq))


def run_case(key: str, time_limit: float, repeated_layers: str = "auto") -> dict:
    """One case in this process: trace and plan; figures as a dict."""
    from torch.distributed.tensor import Replicate, Shard

    from autoshard import AutoParallel
    from autoshard.trace.fake_pg import fake_world

    case = CASES[key]
    # the clock starts once the user's model exists (building it on meta is not planning)
    model, input_fn = _model_and_inputs(key)
    t0, cpu0 = time.perf_counter(), time.process_time()
    with fake_world(case.mesh, case.dim_names) as mesh:
        mp = None
        if case.bf16:
            import torch
            from torch.distributed.fsdp import MixedPrecisionPolicy

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        with AutoParallel(
            model,
            input_fn,
            mesh,
            mp,
            time_limit_s=time_limit,
            plan_cache=False,
            repeated_layers=repeated_layers,
        ) as autop:
            trace_s, trace_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
            nodes = sum(1 for n in autop.gm.graph.nodes if n.op == "call_function")
            n_inputs = len(input_fn())
            autop.add_input_constraints([(Shard(0),) + (Replicate(),) * (mesh.ndim - 1)] * n_inputs)
            t1 = time.perf_counter()
            result = autop.optimize_placement()
            plan_s = time.perf_counter() - t1
    plan = getattr(result, "plan", result)
    s = plan["summary"]
    total, bound = float(s["total_us"]), float(s.get("lower_bound_us", 0.0))
    return {
        "case": key,
        "nodes": nodes,
        "trace_s": trace_s,
        "trace_cpu_s": trace_cpu_s,
        "plan_s": plan_s,
        "solve_s": float(s.get("solve_time_s", float("nan"))),
        "total_us": total,
        "gap": (total - bound) / total if total > 0 else 0.0,
        "status": s.get("solver_status", ""),
        "tied": "planned tied" in plan.get("report", ""),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cases",
        default="quick",
        help="comma-separated case names, 'quick' (default) or 'all'; cases: " + ", ".join(CASES),
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        help="time_limit_s: caps optimize_placement (graph export, planner); default: "
        "AutoParallel's",
    )
    p.add_argument(
        "--repeated-layers",
        default="auto",
        choices=("auto", "tie", "untie"),
        help="identical layers tied, untied, or tied where large (default auto)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(run_case(a.worker, a.time_limit, a.repeated_layers)))
        return
    keys = (
        [k for k, c in CASES.items() if c.quick or a.cases == "all"]
        if a.cases in ("quick", "all")
        else a.cases.split(",")
    )
    unknown = [k for k in keys if k not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    print(
        f"planner time limit {a.time_limit:g} s, repeated layers {a.repeated_layers}; one "
        f"process per case\n"
    )
    print(
        "| case | mesh | nodes | trace | trace CPU | plan | solve | whole | gap | status | "
        "peak RSS | plan cost |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for key in keys:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            key,
            "--time-limit",
            str(a.time_limit),
            "--repeated-layers",
            a.repeated_layers,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        mesh = "x".join(map(str, CASES[key].mesh))
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
            print(
                f"| {key} | {mesh} | - | - | - | - | - | - | - | failed: {err} | - | - |",
                flush=True,
            )
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"| {key} | {mesh} | {r['nodes']} | {r['trace_s']:.1f} s | "
            f"{r['trace_cpu_s']:.1f} s | {r['plan_s']:.1f} s | "
            f"{r['solve_s']:.1f} s | {r['trace_s'] + r['plan_s']:.1f} s | "
            f"{100 * r['gap']:.2f} % | {r['status']}{', tied' if r['tied'] else ''} | "
            f"{r['peak_rss_mb']:.0f} MB | {r['total_us']:.0f} us |",
            flush=True,
        )
    print("\ncases: " + "; ".join(f"{k}: {c.name}" for k, c in CASES.items() if k in keys))


if __name__ == "__main__":
    main()
