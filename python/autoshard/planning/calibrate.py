"""A hardware profile measured on the process group the plan will run on.

The built-in "CPU" profile describes one idle core per rank; the real figures depend on the
host (cores, vector units, how many ranks share them, loopback vs network). When a CPU mesh
runs on a real process group, a few short measurements give the cost model the numbers of
THIS group: matmul throughput and per-op dispatch cost on each rank, and the fixed cost and
bandwidth of its collectives. Every rank takes the slowest rank's figures (an all-reduce
MAX), so all ranks plan with the same profile and reach the same plan. It takes a fraction
of a second.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

_MATMUL_N = 256  # square fp32 matmul: large enough to run at full speed, ~1 ms
_BANDWIDTH_BYTES = 4 << 20
_REPEATS = 7
_BURST_S = 2e-3  # compute before each timed collective, as between a step's syncs


def _median_seconds(fn, repeats: int = _REPEATS) -> float:
    fn()  # warm-up (allocations, lazy initialisation)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_cpu_profile(group=None) -> dict:
    """The hardware profile (a JSON object for the planner's ``hardware`` option, based on
    "CPU") measured on ``group`` (default: the world). Every rank must call it."""
    a = torch.randn(_MATMUL_N, _MATMUL_N)
    b = torch.randn(_MATMUL_N, _MATMUL_N)
    # all ranks compute at once, as in a step (ranks may share cores)
    dist.barrier(group=group)
    matmul_s = _median_seconds(lambda: torch.mm(a, b))
    one = torch.ones(1)
    op_s = _median_seconds(lambda: [one.add(1) for _ in range(100)]) / 100
    world = dist.get_world_size(group)
    # A collective in a step follows compute, and its cost there includes waiting for the
    # slowest rank: ranks that share cores are descheduled mid-compute and arrive late (4
    # gloo ranks on 2 cores: ~0.8 ms per scalar all-reduce in a tight loop, 3-6 ms after a
    # few ms of compute). So each collective is timed after a burst of compute, minus the
    # compute alone.
    burst = max(1, round(_BURST_S / max(matmul_s, 1e-6)))

    def compute():
        for _ in range(burst):
            torch.mm(a, b)

    compute_s = _median_seconds(compute)
    latency_s = _median_seconds(lambda: (compute(), dist.all_reduce(one, group=group)))
    big = torch.ones(_BANDWIDTH_BYTES // 4)
    big_s = _median_seconds(lambda: (compute(), dist.all_reduce(big, group=group)), repeats=3)
    latency_s, big_s = max(latency_s - compute_s, 1e-6), max(big_s - compute_s, 1e-6)
    figures = torch.tensor([matmul_s, op_s, latency_s, big_s], dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=group)
    matmul_s, op_s, latency_s, big_s = figures.tolist()
    # a ring all-reduce moves 2 (n-1)/n of the buffer through each rank's link
    moved = 2 * (world - 1) / world * _BANDWIDTH_BYTES if world > 1 else _BANDWIDTH_BYTES
    bandwidth = moved / max(big_s - latency_s, 1e-6)
    flops = 2 * _MATMUL_N**3 / matmul_s
    return {
        "base": "CPU",
        "name": f"CPU (measured on {world} ranks)",
        "peak_flops_fp32": flops,
        "peak_flops_fp32_cuda_core": flops,
        "peak_flops_fp64": flops / 2,
        "peak_flops_bf16": flops / 2,
        "flop_efficiency": 1.0,
        "kernel_floor_us": op_s * 1e6,
        "collective_launch_us": latency_s * 1e6,
        "intra_node_latency_us": 0.0,
        "inter_node_latency_us": 0.0,
        "intra_node_bandwidth": bandwidth,
        "inter_node_bandwidth": bandwidth,
        "intra_node_efficiency": 1.0,
        "inter_node_efficiency": 1.0,
    }
