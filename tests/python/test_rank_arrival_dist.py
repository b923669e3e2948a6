"""2 gloo ranks under torchrun: a rank that never reaches planning is named by the other
within rank_timeout_s and the job ends with that message (not a hang); a rank that comes
after the others gave up stops too, saying so. The check uses the process group's store,
so it behaves the same on NCCL (where a barrier would hang)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from conftest import DIST_DIR


def _torchrun(kind: str, timeout_s: float, out_dir) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(DIST_DIR / "arrival_worker.py"),
        kind,
        str(timeout_s),
        str(out_dir),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    return proc, time.monotonic() - t0


def test_a_rank_that_never_arrives_ends_the_job_with_its_name(tmp_path):
    proc, seconds = _torchrun("never", 3.0, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "rank 0: autoshard: rank(s) 1 did not reach planning within 3 s" in out, out[-3000:]
    # torchrun's start-up and teardown included; a hang would run into the 180 s limit
    assert seconds < 120, seconds


def test_a_rank_that_comes_after_the_others_gave_up_stops_too(tmp_path):
    proc, _ = _torchrun("late", 2.0, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    first, late = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert not first["ok"] and first["error"].startswith(
        "autoshard: rank(s) 1 did not reach planning within 2 s"
    ), first
    assert first["seconds"] < 20, first
    assert not late["ok"] and "this rank (1) reached planning after the others" in late["error"]
