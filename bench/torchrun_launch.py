"""Run a bench script's own ``--worker`` mode on N gloo ranks under torchrun and read back
what rank 0 wrote: the launcher the side-by-side benches share."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def run_workers(script: str, ranks: int, args: argparse.Namespace) -> dict:
    """``script --worker --out FILE`` with every option of ``args`` passed on, one thread
    per rank; returns the JSON rank 0 wrote to FILE, or exits with the workers' output
    tail when torchrun fails."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc-per-node={ranks}", script, "--worker", "--out", out]
        cmd += [
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k not in ("worker", "out") and v is not None
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-6000:], file=sys.stderr)
            raise SystemExit(f"torchrun failed ({proc.returncode})")
        with open(out) as f:
            return json.load(f)
