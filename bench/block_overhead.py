"""The lowered program's overhead on one rank, and the cost model's compute estimate, for
one Llama-3-8B-shaped block (issue "compiled per-rank program", acceptance 4).

On a 1-rank mesh the plan has no communication, so what the planned module adds to the
plain eager model is the runtime's own cost: the lowered forward/backward graphs and the
autograd.Function around them (and, with compile=True, what inductor gains). Timed, side
by side in one process: the eager block, the planned module (program), the planned module
with compile=True, each a forward + backward of a sum-of-squares loss, median over --iters
steps after warm-up (CUDA events on a GPU). Then the planner's compute estimate for the
same step (plan summary ``compute_us``) against the measured eager step.

    python3 bench/block_overhead.py                              # H200/H100: 8B block, seq 4096, bf16
    python3 bench/block_overhead.py --device cpu --dim 256 --hidden 512 --heads 4 \\
        --kv-heads 2 --seq 128 --dtype float32                   # anywhere (small)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_time import Block  # noqa: E402  (the bench's Llama-style block)


class OneBlock(nn.Module):
    """The block with a scalar loss, so a step is forward + backward."""

    def __init__(self, a):
        super().__init__()
        self.block = Block(a.dim, a.heads, a.kv_heads, a.hidden)

    def forward(self, x):
        return self.block(x).float().pow(2).mean()


def _timer(device: torch.device):
    if device.type == "cuda":

        def run(fn, iters):
            times = []
            for _ in range(iters):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            return statistics.median(times)

    else:

        def run(fn, iters):
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

    return run


def _step(model, x):
    def fn():
        loss = model(x)
        loss.backward()
        for p in model.parameters():
            p.grad = None

    return fn


def _planned(a, ref: nn.Module, x: torch.Tensor, mesh, compile: bool):
    from autoshard import AutoParallel
    from autoshard.runtime.module_state import load_full_state_dict

    with torch.device("meta"):
        meta = OneBlock(a).to(a.torch_dtype)
    with AutoParallel(
        meta,
        lambda: (torch.empty(x.shape, dtype=x.dtype),),
        mesh,
        compile=compile,
        plan_cache=False,
        hardware=a.hardware,
    ) as autop:
        plan = autop.optimize_placement()
        par = autop.apply_placement(plan)
    par.to_empty(device=x.device)
    load_full_state_dict(par, ref.state_dict())
    return par, plan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--hidden", type=int, default=14336)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--hardware", default=None, help="planner profile (default: the mesh's)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-compile", action="store_true", help="skip the compile=True variant")
    a = p.parse_args()
    a.torch_dtype = getattr(torch, a.dtype)
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (1,))
    torch.manual_seed(0)
    ref = OneBlock(a).to(device=device, dtype=a.torch_dtype)
    x = torch.randn(a.batch, a.seq, a.dim, device=device, dtype=a.torch_dtype)
    timer = _timer(device)
    variants = {"eager": (ref, None)}
    variants["program"] = _planned(a, ref, x, mesh, compile=False)
    if not a.no_compile:
        variants["program, compile=True"] = _planned(a, ref, x, mesh, compile=True)
    with torch.no_grad():
        want = ref(x)
    times = {}
    for name, (model, _) in variants.items():
        fn = _step(model, x)
        for _ in range(a.warmup):
            fn()
        if name != "eager":
            with torch.no_grad():
                got = model(x)
            got = got.full_tensor() if hasattr(got, "full_tensor") else got
            err = float((got.float() - want.float()).abs().max())
            print(f"{name}: loss {float(got):.6g} vs eager {float(want):.6g} (|diff| {err:.2g})")
        times[name] = timer(fn, a.iters)
    print(
        f"\nblock: dim {a.dim}, heads {a.heads} ({a.kv_heads} kv), hidden {a.hidden}, "
        f"batch {a.batch} x seq {a.seq}, {a.dtype}, {device}; forward + backward, median of "
        f"{a.iters} after {a.warmup}\n"
    )
    print("| variant | step | / eager |\n|---|---:|---:|")
    for name, t in times.items():
        print(f"| {name} | {t * 1e3:.3f} ms | {t / times['eager']:.3f} |")
    plan = variants["program"][1]
    compute_us = float(plan.get("summary", {}).get("compute_us", 0.0))
    print(
        f"\ncost model compute estimate {compute_us / 1e3:.3f} ms vs measured eager step "
        f"{times['eager'] * 1e3:.3f} ms (measured / estimate "
        f"{times['eager'] * 1e6 / compute_us:.2f})"
        if compute_us
        else "\nthe plan has no compute estimate"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
