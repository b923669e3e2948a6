#!/usr/bin/env python3
"""Solve the IOPDDL benchmark instances with `autoshard solve` under the contest time limits.

Prints, per instance: cost, best known cost, score (best_known / cost; 0 for no valid plan),
lower bound, wall time, peak RSS of the solver process; then the total score.

    python3 bench/iopddl.py                      # all instances, full contest limits
    python3 bench/iopddl.py --only B,G           # a subset
    python3 bench/iopddl.py --time-scale 0.1     # quick run at 10% of each limit
    python3 bench/iopddl.py --cli build/exact/autoshard-cli --extra=--exact
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# shared/ lies beside the checkout (../shared from the project root).
DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "iopddl"

# Contest time limit (s) and best known cost (shared/bench/iopddl/README.md).
INSTANCES = {
    "A": (60, 6_548_641_531),
    "B": (60, 532_843),
    "C": (60, 84_102_445_260),
    "G": (120, 217_039),
    "L": (180, 1_970_993_742),
    "P": (240, 651_833_115_436),
    "S": (240, 1_511_377_982),
}


def find_cli(explicit):
    """The solver command: --cli, else a built autoshard-cli, else the `autoshard` script."""
    if explicit:
        return [explicit]
    for cand in sorted(ROOT.glob("build/*/autoshard-cli")):
        if os.access(cand, os.X_OK):
            return [str(cand)]
    script = shutil.which("autoshard")
    if script:
        return [script]
    sys.exit(
        "no solver found: build the autoshard_cli target or pip install the package, or pass --cli PATH"
    )


def run_one(cli, path, limit, extra):
    """Runs one solve; returns (rc, stdout, stderr, wall seconds, peak RSS in MB or None).
    The peak RSS is the child's own, read from /usr/bin/time -v when it exists, else from a
    one-child wrapper process whose RUSAGE_CHILDREN is exactly that child."""
    cmd = cli + ["solve", str(path), "--time-limit", f"{limit:g}"] + extra
    if os.access("/usr/bin/time", os.X_OK):
        cmd = ["/usr/bin/time", "-v"] + cmd
    else:
        wrapper = (
            "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
            "print('Maximum resident set size (kbytes): %d' % "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)"
        )
        cmd = [sys.executable, "-c", wrapper] + cmd
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    rss_mb = int(m.group(1)) / 1024.0 if m else None
    err = "\n".join(
        line
        for line in proc.stderr.splitlines()
        if not line.startswith("\t") and not line.startswith("Command exited with")
    )
    return proc.returncode, proc.stdout, err, wall, rss_mb


def field(text, name):
    m = re.search(rf"^{re.escape(name)}: (\S+)", text, re.MULTILINE)
    return m.group(1) if m else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated instance letters, e.g. B,G")
    ap.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every contest limit (e.g. 0.1)"
    )
    ap.add_argument("--cli", help="path of the autoshard-cli executable (or the autoshard script)")
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="folder with the *.json.gz instances")
    ap.add_argument(
        "--extra", action="append", default=[], help="extra option passed to solve (repeatable)"
    )
    args = ap.parse_args(argv)
    if args.time_scale <= 0:
        ap.error("--time-scale must be > 0")
    names = (
        sorted(INSTANCES)
        if not args.only
        else [s.strip() for s in args.only.split(",") if s.strip()]
    )
    unknown = [n for n in names if n not in INSTANCES]
    if unknown:
        ap.error(f"unknown instance(s) {unknown}; known: {sorted(INSTANCES)}")
    cli = find_cli(args.cli)
    print(f"solver: {' '.join(cli)}   time scale: {args.time_scale:g}")
    header = f"{'inst':4} {'limit s':>7} {'cost':>18} {'best known':>18} {'score':>7} {'lower bound':>18} {'time s':>7} {'peak RSS MB':>11}  status"
    print(header)
    print("-" * len(header))
    total = 0.0
    for name in names:
        limit_full, best = INSTANCES[name]
        limit = limit_full * args.time_scale
        path = Path(args.dir) / f"{name}.json.gz"
        if not path.exists():
            print(f"{name:4} missing file {path}")
            continue
        rc, out, err, wall, rss_mb = run_one(cli, path, limit, args.extra)
        cost_s, lb_s = field(out, "cost"), field(out, "lower bound")
        status = field(out, "status") or ""
        if "proven optimal" in out:
            status = "proven optimal"
        if rc == 0 and cost_s is not None:
            cost = float(cost_s)
            score = best / cost if cost > 0 else 1.0
        else:
            cost, score = None, 0.0
            status = f"rc={rc} " + (
                err.strip().splitlines()[-1] if err.strip() else "no valid plan"
            )
        total += score
        cost_txt = f"{cost:,.0f}" if cost is not None else "-"
        lb_txt = f"{float(lb_s):,.0f}" if lb_s not in (None, "none") else "-"
        rss_txt = f"{rss_mb:.0f}" if rss_mb is not None else "?"
        print(
            f"{name:4} {limit:7.1f} {cost_txt:>18} {best:>18,} {score:7.4f} {lb_txt:>18} {wall:7.1f} {rss_txt:>11}  {status}",
            flush=True,
        )
    print(f"total score: {total:.4f} / {len(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
