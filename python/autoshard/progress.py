"""Progress of the planning stages (trace, plan, lower): logging, plus a tqdm bar on a TTY.

    with progress.stage("plan", expected_s=time_limit):
        plan = autop.optimize_placement()
    progress.log_solver_result(plan)

Each stage logs its start and its elapsed time on the "autoshard.progress" logger. The C++
planner reports nothing while it runs, but it releases the GIL, so a background thread can
tick a bar against the stage's expected time (the solver's time limit: it stops there at
the latest, earlier when the plan is proven optimal). After planning, the solver's result
(best cost, lower bound, gap, status) is logged from the plan's summary.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import contextmanager

log = logging.getLogger("autoshard.progress")

_TICK_S = 0.25


def bar_enabled(stream=None) -> bool:
    """A bar only where someone watches: stderr is a terminal (not a log file or a pipe)."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or file-like without isatty
        return False


@contextmanager
def stage(name: str, expected_s: float | None = None, bar: bool | None = None):
    """Log ``name``'s start and elapsed time; on a TTY (or ``bar=True``) show a tqdm bar of
    elapsed seconds against ``expected_s`` (a spinner-style counter without it)."""
    t0 = time.perf_counter()
    log.info(
        "autoshard: stage %s started%s", name, f" (up to {expected_s:g} s)" if expected_s else ""
    )
    show = bar_enabled() if bar is None else bar
    stop = threading.Event()
    ticker = None
    pbar = None
    if show:
        from tqdm import tqdm

        pbar = tqdm(
            total=expected_s,
            desc=f"autoshard {name}",
            unit="s",
            leave=False,
            file=sys.stderr,
            bar_format=(
                "{desc}: {percentage:3.0f}%|{bar}| {elapsed}" if expected_s else "{desc}: {elapsed}"
            ),
        )

        def tick():
            while not stop.wait(_TICK_S):
                done = time.perf_counter() - t0
                pbar.n = min(done, expected_s) if expected_s else done
                pbar.refresh()

        ticker = threading.Thread(target=tick, name=f"autoshard-progress-{name}", daemon=True)
        ticker.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
        if pbar is not None:
            pbar.close()
        log.info(
            "autoshard: stage %s %s in %.2f s",
            name,
            "done" if ok else "failed",
            time.perf_counter() - t0,
        )


def solver_result(plan: dict) -> dict:
    """The solver's figures from a plan's summary: best cost and lower bound (us), the gap
    between them (fraction of the cost), status, and times; absent fields are left out."""
    s = plan.get("summary", {})
    out = {}
    for key in (
        "total_us",
        "lower_bound_us",
        "solver_status",
        "proven_optimal",
        "solve_time_s",
        "planning_time_s",
    ):
        if key in s:
            out[key] = s[key]
    if "total_us" in out and "lower_bound_us" in out and float(out["total_us"]) > 0:
        out["gap"] = max(
            0.0, (float(out["total_us"]) - float(out["lower_bound_us"])) / float(out["total_us"])
        )
    return out


def log_solver_result(plan: dict) -> dict:
    """Log the solver's result (logger "autoshard.progress") and return it."""
    r = solver_result(plan)
    parts = []
    if "total_us" in r:
        parts.append(f"best cost {float(r['total_us']) / 1e3:.3f} ms")
    if "lower_bound_us" in r:
        parts.append(f"lower bound {float(r['lower_bound_us']) / 1e3:.3f} ms")
    if "gap" in r:
        parts.append(f"gap {100 * r['gap']:.2f}%")
    if "solver_status" in r:
        parts.append(
            f"status {r['solver_status']}"
            + (" (proven optimal)" if r.get("proven_optimal") else "")
        )
    if "solve_time_s" in r:
        parts.append(f"solve {float(r['solve_time_s']):.2f} s")
    if "planning_time_s" in r:
        parts.append(f"planning {float(r['planning_time_s']):.2f} s")
    log.info("autoshard: plan: %s", ", ".join(parts) if parts else "no solver figures")
    return r
