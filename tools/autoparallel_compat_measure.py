"""Run AutoParallel's own test files against autoshard and count what passes.

This script holds none of AutoParallel's code. Fetch AutoParallel's test files
(meta-pytorch/autoparallel, tests/test_*.py) into a folder outside this repository
yourself, then:

    python tools/autoparallel_compat_measure.py --src /tmp/ap_compat/orig \\
        [--work /tmp/ap_compat/run] [--timeout 900] [test_api.py ...]

For each file it writes a copy into --work with only these changes:
- imports: ``autoparallel`` -> ``autoshard`` (``from autoparallel.api import X`` ->
  ``from autoshard import X``; other ``autoparallel.<module>`` paths become
  ``autoshard.<module>``, which fail to import where autoshard has no such module);
- the CPU run: the device string ``"cuda"`` -> ``"cpu"`` and ``.cuda()`` -> ``.cpu()``
  (this machine has no GPU; AutoParallel's tests on a CPU host need the same).
It also writes its own conftest.py (a fake process group of 256 ranks, meshes named as
AutoParallel's fixtures name them, and ``apply_cuda_patches``), runs pytest on each file
in its own process under a time limit (--timeout seconds per file) and prints per-file
passed / failed / error counts, then each failing test with the last line of its error.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULT_FILES = [
    "test_auto_parallel_simple.py",
    "test_api.py",
    "test_init_weights.py",
    "test_optimize_placement.py",
    "test_dynamic_shapes.py",
    "test_grad_reduce_dtype.py",
    "test_correctness.py",
    "test_propagation_rules.py",
    "test_estimate_graph_metrics.py",
    "test_export_json.py",
]

CONFTEST = '''\
"""Written by autoshard's tools/autoparallel_compat_measure.py (its own fixtures)."""
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

WORLD_SIZE = 256


def apply_cuda_patches(func):
    """What AutoParallel's helper of this name does: answer CUDA device queries as an
    8 x H100 host would."""
    props = type("Props", (), {"major": 9, "minor": 0, "name": "H100",
                               "total_memory": 80 * 2**30, "multi_processor_count": 132,
                               "L2_cache_size": 50 * 2**20})()
    for p in (mock.patch("torch.cuda.device_count", lambda: 8),
              mock.patch("torch.cuda.get_device_name", lambda *a, **k: "H100"),
              mock.patch("torch.cuda.get_device_capability", lambda *a, **k: (9, 0)),
              mock.patch("torch.cuda.get_device_properties", lambda *a, **k: props)):
        func = p(func)
    return func


def _ensure_pg():
    if not dist.is_initialized():
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)


@pytest.fixture(scope="module", autouse=True)
def init_pg():
    _ensure_pg()


def _mesh(shape, names):
    _ensure_pg()
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


@pytest.fixture(scope="module")
def device_mesh_1d():
    return _mesh((WORLD_SIZE,), ("dp",))


@pytest.fixture(scope="module")
def device_mesh_2d():
    return _mesh((WORLD_SIZE // 8, 8), ("dp", "tp"))


@pytest.fixture(scope="module")
def device_mesh_3d():
    return _mesh((WORLD_SIZE // 32, 8, 4), ("dp", "tp", "cp"))


@pytest.fixture(scope="module")
def device_mesh_hsdp_3d():
    return _mesh((2, WORLD_SIZE // 16, 8), ("dp_replicate", "fsdp", "tp"))
'''


def switch(text: str) -> str:
    """AutoParallel's test text -> the same test against autoshard on CPU."""
    # `from autoparallel.api import X` -> `from autoshard import X` (autoshard's package
    # root exports the API names); `from autoparallel import X` likewise
    text = re.sub(
        r"^(\s*)from autoparallel\.api import", r"\1from autoshard import", text, flags=re.M
    )
    text = re.sub(
        r"^(\s*)from autoparallel(\.\S+)? import",
        lambda m: f"{m.group(1)}from autoshard{m.group(2) or ''} import",
        text,
        flags=re.M,
    )
    text = re.sub(
        r"^(\s*)import autoparallel\b", r"\1import autoshard as autoparallel", text, flags=re.M
    )
    text = re.sub(r"^(\s*)from tests\.conftest import", r"\1from conftest import", text, flags=re.M)
    # the CPU run
    text = text.replace('"cuda"', '"cpu"').replace("'cuda'", "'cpu'")
    text = text.replace(".cuda()", ".cpu()")
    return text


def run_file(path: Path, work: Path, timeout: int) -> dict:
    xml = work / (path.stem + ".xml")
    if xml.exists():
        xml.unlink()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--junitxml",
        str(xml),
        path.name,
    ]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        proc = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        (work / (path.stem + ".log")).write_text(proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        (work / (path.stem + ".log")).write_text(out + f"\nTIMEOUT after {timeout} s\n")
    result = {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "failures": []}
    if not xml.exists():
        result["error"] = 1
        result["failures"].append((path.stem, "no result (timeout or collection crash)"))
        return result
    for case in ET.parse(xml).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if case.find("skipped") is not None:
            result["skipped"] += 1
        elif bad is not None:
            result["failed" if bad.tag == "failure" else "error"] += 1
            msg = (bad.get("message") or "").strip().splitlines()
            result["failures"].append((case.get("name"), msg[0][:160] if msg else ""))
        else:
            result["passed"] += 1
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--src",
        required=True,
        type=Path,
        help="folder holding AutoParallel's test files (fetched separately)",
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/ap_compat/run"))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per file")
    ap.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = ap.parse_args()
    repo = Path(__file__).resolve().parents[1]
    if args.work.resolve().is_relative_to(repo):
        ap.error("--work must be outside this repository")
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "conftest.py").write_text(CONFTEST)
    rows = []
    for name in args.files:
        src = args.src / name
        if not src.exists():
            print(f"{name}: not in {args.src}", file=sys.stderr)
            continue
        dst = args.work / name
        dst.write_text(switch(src.read_text()))
        res = run_file(dst, args.work, args.timeout)
        total = res["passed"] + res["failed"] + res["error"] + res["skipped"]
        rows.append((name, res, total))
        print(
            f"{name:36s} {res['passed']:3d} / {total:3d} passed"
            f" (failed {res['failed']}, errors {res['error']}, skipped {res['skipped']})",
            flush=True,
        )
    passed = sum(r[1]["passed"] for r in rows)
    total = sum(r[2] for r in rows)
    print(f"{'all':36s} {passed:3d} / {total:3d} passed")
    for name, res, _ in rows:
        for test, msg in res["failures"]:
            print(f"  FAIL {name}::{test}: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
