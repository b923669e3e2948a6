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


def _train(folder, steps: int, *extra: str) -> str:
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
        *extra,
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


def test_mesh_layout_adds_the_cp_dim():
    sys.path.insert(0, str(REPO / "examples"))
    from train_config import DEFAULTS, ConfigError, mesh_layout

    p = dict(DEFAULTS["parallel"])
    assert mesh_layout(p, 4) == ((4,), ("dp",))
    assert mesh_layout({**p, "cp": 2}, 4) == ((2, 2), ("dp", "cp"))
    assert mesh_layout({**p, "cp": 2, "mesh": [2, 2], "dim_names": ["dp", "tp"]}, 8) == (
        (2, 2, 2),
        ("dp", "tp", "cp"),
    )
    with pytest.raises(ConfigError, match="parallel.cp = 3 does not divide the 4 ranks"):
        mesh_layout({**p, "cp": 3}, 4)
    with pytest.raises(ConfigError, match="set its size with parallel.cp"):
        mesh_layout({**p, "dim_names": ["cp"]}, 4)


@pytest.fixture(scope="module")
def dp_losses(tmp_path_factory) -> dict[int, float]:
    """Plain data parallelism's (dp=2) first two losses: what cp and pp runs must match."""
    return _losses(_train(tmp_path_factory.mktemp("dp"), 2, "--checkpoint.interval", "0"))


def test_train_with_cp_matches_data_parallel(tmp_path, dp_losses):
    """--parallel.cp 2 on 2 ranks (mesh dp=1 x cp=2: each rank half of every sequence, in
    head-tail order) trains to the losses of plain data parallelism (dp=2)."""
    dp = dp_losses
    out = _train(tmp_path / "cp", 2, "--checkpoint.interval", "0", "--parallel.cp", "2")
    assert "on mesh [1, 2] ['dp', 'cp']" in out, out[-3000:]
    cp = _losses(out)
    assert sorted(cp) == sorted(dp) == [1, 2]
    for step in (1, 2):
        assert cp[step] == pytest.approx(dp[step], rel=1e-4, abs=1e-4)


def test_mesh_layout_of_a_pipeline():
    sys.path.insert(0, str(REPO / "examples"))
    from train_config import DEFAULTS, ConfigError, mesh_layout

    p = dict(DEFAULTS["parallel"])
    assert mesh_layout({**p, "pp": 2}, 4) == ((2, 2), ("pp", "dp"))
    assert mesh_layout({**p, "pp": 0}, 4) == (None, ("pp", "dp"))  # chosen
    with pytest.raises(ConfigError, match="parallel.pp = 3 does not divide the 4 ranks"):
        mesh_layout({**p, "pp": 3}, 4)
    with pytest.raises(ConfigError, match="with parallel.cp or parallel.mesh"):
        mesh_layout({**p, "pp": 2, "cp": 2}, 4)


def test_train_with_pp_matches_data_parallel_and_resumes(tmp_path, dp_losses):
    """--parallel.pp 2 on 2 ranks (mesh pp=2 x dp=1: two stages, the schedule and
    microbatches chosen) trains to the losses of data parallelism (dp=2), checkpoints under
    the model's names, and a run with the mesh chosen (--parallel.pp 0: pp=2 x dp=1 on two
    ranks) resumes where that checkpoint left off."""
    dp = dp_losses
    folder = tmp_path / "pp"
    first = _train(folder, 4, "--parallel.pp", "2")
    assert "on mesh [2, 1] ['pp', 'dp']" in first and "candidates priced" in first, first[-3000:]
    pp = _losses(first)
    assert sorted(pp) == [1, 2, 3, 4]
    for step in (1, 2):
        assert pp[step] == pytest.approx(dp[step], rel=1e-4, abs=1e-4)
    shutil.rmtree(folder / "step-4")
    second = _train(folder, 4, "--parallel.pp", "0")
    assert "checkpoint: resumed from step 2" in second, second[-3000:]
    assert "chosen pp=2 dp=1" in second and "on mesh [2, 1] ['pp', 'dp']" in second
    after = _losses(second)
    assert sorted(after) == [3, 4]
    for step in (3, 4):
        assert after[step] == pytest.approx(pp[step], rel=1e-4, abs=1e-4)
