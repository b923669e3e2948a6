"""scripts/gpu_check.sh, the first command to run on a GPU machine, runs to its end on a
machine without CUDA: exit code 0, its table printed with every CUDA row marked
"skipped (no CUDA)" and the rows that need no GPU (the demo, the compute calibration's
estimates) run. (--quick: a shorter demo, for the test's time.)"""

from __future__ import annotations

import subprocess

import pytest
import torch

from conftest import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU mode (no CUDA)")
def test_gpu_check_runs_to_its_end_without_cuda():
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = {
        cells[0]: cells[1]
        for cells in (
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| check")
        )
    }
    cuda_rows = [
        "pytest -m cuda",
        "Llama 1 rank: fp32, program (nccl)",
        "Llama 1 rank: fp32, program, compile (nccl)",
        "Llama 1 rank: fp32, interpret (nccl)",
        "Llama 1 rank: bf16 mixed precision, sdpa, program (nccl)",
        "Llama 1 rank: bf16 mixed precision, sdpa, program, compile (nccl)",
        "Llama 1 rank: bf16 mixed precision, sdpa, interpret (nccl)",
        "host syncs / H2D copies per step (fp32 program)",
        "peak memory (fp32 program)",
        "bench/block_overhead.py (small)",
    ]
    for row in cuda_rows:
        assert rows.get(row) == "skipped (no CUDA)", (row, out[-4000:])
    assert rows["autoshard demo --layers 2"] == "ok", out[-4000:]
    assert rows["bench/calibrate_compute.py (small)"] == "ok", out[-4000:]
    assert "gpu_check: no CUDA device" in proc.stdout
