#!/usr/bin/env python3
"""Compare the roofline compute model with measured kernel times on the local CUDA GPU.

For the local ops of one Llama-3-8B decoder layer (forward), at a given tensor-parallel degree,
prints the estimate of ``autoshard._core.compute_time_us`` (the planner's model, see
docs/cost_model.md) and, when a CUDA device is present, the measured time (CUDA events, median
of --iters runs after warm-up). Without a GPU it prints the estimates only, so it runs anywhere.

    python bench/calibrate_compute.py                      # H100 profile, tp=1, seq 4096
    python bench/calibrate_compute.py --hardware H200 --tp 8 --seq 8192
    python bench/calibrate_compute.py --fp32-no-tf32       # float32 matmuls without TF32

The ratio column (measured / estimated) is what to feed back into the profile's efficiencies.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import Callable

try:
    from autoshard import _core
except ImportError as exc:  # pragma: no cover
    sys.exit(f"autoshard._core is not built ({exc}); run: pip install --no-build-isolation -e .")

# Llama-3-8B (Meta's params.json): dim 4096, 32 heads of 128, 8 KV heads, FFN 14336.
HIDDEN = 4096
HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
FFN = 14336
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass
class LocalOp:
    name: str
    flops: float
    bytes_moved: float
    make: Callable[[], Callable[[], object]] | None  # builds the kernel on the GPU, or None


def llama_layer_ops(tokens: int, tp: int, dtype: str, torch=None, device=None) -> list[LocalOp]:
    """The layer's local ops on one tensor-parallel rank (Megatron-style column/row split)."""
    if HEADS % tp or KV_HEADS % tp or FFN % tp:
        raise ValueError(
            f"tp={tp} must divide the heads ({HEADS}), KV heads ({KV_HEADS}) and FFN ({FFN})"
        )
    e = DTYPE_BYTES[dtype]
    q_out, kv_out, ffn = HIDDEN // tp, KV_HEADS * HEAD_DIM // tp, FFN // tp
    heads = HEADS // tp

    def matmul(name: str, m: int, k: int, n: int) -> LocalOp:
        def make():
            a = torch.randn(m, k, device=device, dtype=getattr(torch, dtype))
            b = torch.randn(k, n, device=device, dtype=getattr(torch, dtype))
            return lambda: a @ b

        return LocalOp(name, 2.0 * m * k * n, (m * k + k * n + m * n) * e, make if torch else None)

    def pointwise(name: str, numel: int, reads: int, fn_name: str) -> LocalOp:
        def make():
            xs = [
                torch.randn(numel, device=device, dtype=getattr(torch, dtype)) for _ in range(reads)
            ]
            if fn_name == "add":
                return lambda: xs[0] + xs[1]
            if fn_name == "silu_mul":
                return lambda: torch.nn.functional.silu(xs[0]) * xs[1]
            raise ValueError(fn_name)

        return LocalOp(name, float(numel * reads), (reads + 1) * numel * e, make if torch else None)

    def rmsnorm() -> LocalOp:
        def make():
            x = torch.randn(tokens, HIDDEN, device=device, dtype=getattr(torch, dtype))
            w = torch.ones(HIDDEN, device=device, dtype=getattr(torch, dtype))
            return lambda: torch.nn.functional.rms_norm(x, (HIDDEN,), w)

        return LocalOp(
            "rmsnorm",
            4.0 * tokens * HIDDEN,
            (2 * tokens * HIDDEN + HIDDEN) * e,
            make if torch else None,
        )

    def attention() -> LocalOp:
        # Causal SDPA: QK^T and PV each 2*T*T*d per head, halved by the causal mask.
        flops = 2 * 2.0 * tokens * tokens * HEAD_DIM * heads / 2
        bytes_moved = 4 * tokens * heads * HEAD_DIM * e  # q, k, v (expanded), out

        def make():
            shape = (1, heads, tokens, HEAD_DIM)
            q, k, v = (
                torch.randn(shape, device=device, dtype=getattr(torch, dtype)) for _ in range(3)
            )
            return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        return LocalOp("sdpa_causal", flops, bytes_moved, make if torch else None)

    return [
        rmsnorm(),
        matmul("wq", tokens, HIDDEN, q_out),
        matmul("wk", tokens, HIDDEN, kv_out),
        matmul("wv", tokens, HIDDEN, kv_out),
        attention(),
        matmul("wo", tokens, q_out, HIDDEN),
        pointwise("residual_add", tokens * HIDDEN, 2, "add"),
        rmsnorm(),
        matmul("w1_gate", tokens, HIDDEN, ffn),
        matmul("w3_up", tokens, HIDDEN, ffn),
        pointwise("silu_mul", tokens * ffn, 2, "silu_mul"),
        matmul("w2_down", tokens, ffn, HIDDEN),
        pointwise("residual_add", tokens * HIDDEN, 2, "add"),
    ]


def time_us(torch, fn: Callable[[], object], warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)  # ms -> us
    return statistics.median(samples)


def detect_hardware(torch) -> str | None:
    if torch is None or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    try:
        _core.hardware_profile(name)
        return name
    except ValueError:
        for known in _core.known_hardware():
            if known.lower() in name.lower():
                print(
                    f"note: device '{name}' is not an exact profile alias; comparing with {known}",
                    file=sys.stderr,
                )
                return known
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--hardware", help="profile to estimate with (default: the local GPU, else H100)"
    )
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of the local shards")
    ap.add_argument("--seq", type=int, default=4096, help="tokens per rank (batch * sequence)")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    ap.add_argument(
        "--fp32-no-tf32", action="store_true", help="float32 matmuls without TF32 (PyTorch default)"
    )
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        torch = None
    has_gpu = torch is not None and torch.cuda.is_available()
    hardware = args.hardware or detect_hardware(torch) or "H100"
    allow_tf32 = not args.fp32_no_tf32
    if has_gpu:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    device = "cuda" if has_gpu else None
    try:
        ops = llama_layer_ops(args.seq, args.tp, args.dtype, torch if has_gpu else None, device)
        profile = _core.hardware_profile(hardware)
    except ValueError as exc:
        ap.error(str(exc))
    print(
        f"Llama-3-8B layer forward, tp={args.tp}, tokens={args.seq}, {args.dtype}, profile {profile['name']}"
        f" (flop eff {profile['flop_efficiency']}, bw eff {profile['bandwidth_efficiency']},"
        f" floor {profile['kernel_floor_us']} us)"
    )
    print(
        "measured on: "
        + (torch.cuda.get_device_name(0) if has_gpu else "no CUDA device (estimates only)")
    )
    print(
        f"{'op':<14}{'GFLOP':>10}{'MB':>10}{'est us':>11}{'bound':>8}"
        + (f"{'meas us':>11}{'meas/est':>10}" if has_gpu else "")
    )
    total_est = total_meas = 0.0
    for op in ops:
        est = _core.compute_time_us(hardware, op.flops, op.bytes_moved, args.dtype, allow_tf32)
        mem = _core.memory_time_us(hardware, op.bytes_moved)
        bound = "mem" if mem >= est - 1e-9 else "flop"
        if mem >= est - 1e-9 and mem <= profile["kernel_floor_us"] + 1e-9:
            bound = "floor"
        line = f"{op.name:<14}{op.flops / 1e9:>10.2f}{op.bytes_moved / 1e6:>10.2f}{est:>11.1f}{bound:>8}"
        total_est += est
        if has_gpu and op.make is not None:
            meas = time_us(torch, op.make(), args.warmup, args.iters)
            total_meas += meas
            line += f"{meas:>11.1f}{meas / est:>10.2f}"
        print(line)
    summary = f"{'total':<14}{'':>10}{'':>10}{total_est:>11.1f}{'':>8}"
    if has_gpu:
        summary += f"{total_meas:>11.1f}{total_meas / total_est:>10.2f}"
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
