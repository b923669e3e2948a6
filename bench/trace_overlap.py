"""How much of a step's communication ran behind compute, read from a torch.profiler trace.

On gloo, a collective is issued on the Python thread (``c10d::...`` / ``_c10d_functional::``
events) and runs on one of gloo's worker threads (``gloo:all_gather``, ``gloo:all_reduce``,
...). The time the worker threads are busy is the communication; the part of it during
which the Python thread runs an ATen op (other than a collective or a wait) is hidden behind
compute, the rest is exposed (the Python thread waits, or runs Python between ops). The
same measure applies to every runtime (autoshard's program, FSDP2, DDP), whatever their
waits are called.

    python3 bench/trace_overlap.py TRACE.json
"""

from __future__ import annotations

import json
import sys


def _is_compute(name: str) -> bool:
    return name.startswith("aten::")


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(xs, ys) -> float:
    """Total length of the overlap of two sorted, disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_summary(trace: dict) -> dict:
    """Communication busy time, its exposed part and its hidden part (milliseconds), and
    the number of gloo operations, from a Chrome trace dict exported by torch.profiler."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    comm = [e for e in events if str(e["name"]).startswith("gloo:")]
    comm_threads = {e["tid"] for e in comm}
    compute = [e for e in events if e["tid"] not in comm_threads and _is_compute(str(e["name"]))]
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in comm])
    computing = _union([(e["ts"], e["ts"] + e["dur"]) for e in compute])
    busy_us = _length(busy)
    exposed_us = busy_us - _intersection(busy, computing)
    return {
        "collectives": len(comm),
        "comm_ms": busy_us / 1e3,
        "exposed_ms": exposed_us / 1e3,
        "hidden_ms": (busy_us - exposed_us) / 1e3,
        "hidden_fraction": (busy_us - exposed_us) / busy_us if busy_us else 0.0,
    }


def main() -> None:
    with open(sys.argv[1]) as f:
        s = overlap_summary(json.load(f))
    print(
        f"{s['collectives']} gloo collectives, busy {s['comm_ms']:.2f} ms: exposed "
        f"{s['exposed_ms']:.2f} ms, hidden behind compute {s['hidden_ms']:.2f} ms "
        f"({100 * s['hidden_fraction']:.0f} %)"
    )


if __name__ == "__main__":
    main()
