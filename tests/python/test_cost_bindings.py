"""The cost models as seen from Python (autoshard._core), against hand-computed numbers, and the
calibration bench's estimate-only mode (no GPU needed)."""

import math
import os
import subprocess
import sys

import pytest

from autoshard import _core

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_profiles_and_datasheet_numbers():
    assert _core.known_hardware() == ["A100", "H100", "H200", "B200", "CPU"]
    h100 = _core.hardware_profile("NVIDIA H100 80GB HBM3")
    assert h100["name"] == "H100"
    assert h100["peak_flops_bf16"] == 989.5e12
    assert _core.hardware_profile("h200")["hbm_bandwidth"] == 4.8e12
    with pytest.raises(ValueError, match="known profiles: A100, H100, H200, B200"):
        _core.hardware_profile("TPUv5")


def test_roofline_matmul_and_dtype_errors():
    flops = 2 * 4096**3
    us = _core.compute_time_us("H100", flops, 3 * 4096 * 4096 * 2, "bfloat16")
    assert math.isclose(us, flops / (989.5e12 * 0.7) * 1e6, rel_tol=1e-12)
    # float32 without TF32 runs at the CUDA-core rate (67 vs 494.5 TFLOPS).
    slow = _core.compute_time_us("H100", flops, 0, "float32", allow_tf32=False)
    fast = _core.compute_time_us("H100", flops, 0, "float32")
    assert math.isclose(slow / fast, 494.5 / 67, rel_tol=1e-12)
    with pytest.raises(ValueError, match="'float33'"):
        _core.compute_time_us("H100", 1, 1, "float33")
    assert _core.dtype_bytes("half") == 2


def test_collectives_and_links():
    links = _core.mesh_dim_links("H100", [8, 8])
    assert [l["nodes"] for l in links] == [8, 1]
    assert links[0]["bandwidth"] == 45e9 and links[1]["bandwidth"] == 360e9
    ring = _core.collective_time_us("all_reduce", 1e9, "H100", [8], 0, "ring")
    assert math.isclose(ring, 2 * 7 / 8 * 1e9 / 360e9 * 1e6 + 14 + 8, rel_tol=1e-12)
    assert _core.collective_time_us("all_gather", 1e9, "H100", [1, 8], 0) == 0.0
    with pytest.raises(ValueError, match="mesh_dim 2"):
        _core.collective_time_us("all_gather", 1e6, "H100", [8, 8], 2)
    with pytest.raises(ValueError, match="'broadcast'"):
        _core.collective_time_us("broadcast", 1e6, "H100", [8], 0)
    assert _core.padded_collective_bytes(5, 4, 10) == 80


def test_calibration_bench_runs_without_gpu():
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "calibrate_compute.py"),
            "--tp",
            "8",
            "--hardware",
            "H200",
            "--seq",
            "2048",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "profile H200" in proc.stdout
    lines = [l for l in proc.stdout.splitlines() if l.startswith(("wq", "w2_down", "total"))]
    assert len(lines) == 3
    # wq at tp=8, 2048 tokens: 2*2048*4096*512 FLOP at 989.5 TFLOPS * 0.7 -> 12.4 us (compute bound)
    expected = 2 * 2048 * 4096 * 512 / (989.5e12 * 0.7) * 1e6
    assert abs(float(lines[0].split()[3]) - expected) < 0.05


def test_custom_hardware_as_json():
    custom = '{"base": "H100", "gpus_per_node": 4, "name": "H100x4"}'
    assert _core.hardware_profile(custom)["gpus_per_node"] == 4
    links = _core.mesh_dim_links(custom, [2, 4])
    assert [l["nodes"] for l in links] == [2, 1]
    with pytest.raises(ValueError, match="hardware.gpus_per_nod: unknown field"):
        _core.hardware_profile('{"base": "H100", "gpus_per_nod": 4}')
    with pytest.raises(ValueError):
        _core.hardware_profile('{"base": "H100",')  # malformed JSON
