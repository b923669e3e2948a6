"""examples/train.py on 2 gloo ranks: per-step log lines, DCP checkpoints, and a resume that
continues exactly where the checkpoint left off (same losses as the uninterrupted run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

STEP_LINE = re.compile(
    r"step:\s+(\d+)\s+loss:\s+([\d.]+)\s+tokens/s:\s+(\d+)\s+"
    r"mfu:\s+([\d.]+)%\s+memory:\s+([\d.]+) MiB"
)


def _train(folder, steps: int) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(REPO / "examples" / "train.py"),
        "--config",
        str(REPO / "examples" / "llama_tiny.toml"),
        "--training.steps",
        str(steps),
        "--checkpoint.interval",
        "2",
        "--checkpoint.folder",
        str(folder),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"train.py failed ({proc.returncode}):\n{out[-6000:]}")
    return out


def _losses(log: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(log)}


def test_train_logs_checkpoints_and_resumes(tmp_path):
    folder = tmp_path / "ckpt"
    first = _train(folder, steps=4)
    lines = STEP_LINE.findall(first)
    assert [int(s) for s, *_ in lines] == [1, 2, 3, 4], first[-3000:]
    for _, loss, tps, mfu, mem in lines:
        assert 0 < float(loss) < 20 and int(tps) > 0 and float(mfu) > 0 and float(mem) > 0
    assert "checkpoint: saved step 2" in first and "checkpoint: saved step 4" in first
    assert (folder / "step-2" / ".metadata").exists()
    assert "autoshard: stage plan done" in first  # planning progress went to the log
    assert "planned memory per GPU: peak" in first  # the plan's predicted memory

    # drop the last checkpoint: the next run resumes from step 2 and redoes steps 3 and 4
    shutil.rmtree(folder / "step-4")
    second = _train(folder, steps=4)
    assert "checkpoint: resumed from step 2" in second, second[-3000:]
    before, after = _losses(first), _losses(second)
    assert sorted(after) == [3, 4]
    for step in (3, 4):
        assert after[step] == pytest.approx(before[step], rel=1e-4, abs=1e-4)
