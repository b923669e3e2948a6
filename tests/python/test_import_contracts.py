"""The Python layer's flow is enforced: `lint-imports` (import-linter, run by scripts/test.sh
with the contracts of pyproject.toml) passes on the package as it is, and fails, naming the
import, when a module imports a later stage or two modules import each other.

The package is copied under another name (so that the copy, not the installed package, is
what import-linter reads) with the contracts renamed to match, and one import is added."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COPY = "autoshard_contract_copy"


def _lint_imports() -> str:
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (scripts/setup.sh installs it)")
    return exe


def _contracts(toml: str) -> str:
    """pyproject.toml's [tool.importlinter] sections, for the renamed copy."""
    start = toml.index("[tool.importlinter]")
    section = toml[start:]
    nxt = re.search(r"^\[(?!\[?tool\.importlinter)", section, re.M)
    section = section[: nxt.start()] if nxt else section
    return re.sub(r"\bautoshard\b", COPY, section)


@pytest.fixture()
def package_copy(tmp_path: Path) -> Path:
    src = ROOT / "python" / "autoshard"
    dst = tmp_path / COPY
    for path in src.rglob("*.py"):
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(re.sub(r"\bautoshard\.", f"{COPY}.", path.read_text()))
    (tmp_path / "contracts.toml").write_text(_contracts((ROOT / "pyproject.toml").read_text()))
    return tmp_path


def _run(tmp_path: Path) -> subprocess.CompletedProcess:
    # (wide lines: the report wraps at the terminal's width)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "400"}
    return subprocess.run(
        [_lint_imports(), "contracts.toml", "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _add_import(tmp_path: Path, module: str, line: str) -> None:
    path = tmp_path / COPY / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _added():\n    {line}\n")


def test_the_package_keeps_its_contracts(package_copy):
    run = _run(package_copy)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 kept, 0 broken" in run.stdout


def test_an_import_of_a_later_stage_fails(package_copy):
    # tracing must not reach the runtime, even from inside a function
    _add_import(package_copy, "trace.fake_pg", f"import {COPY}.runtime.parallel_module")
    run = _run(package_copy)
    assert run.returncode != 0
    assert f"{COPY}.trace is not allowed to import {COPY}.runtime" in run.stdout
    assert f"{COPY}.trace.fake_pg -> {COPY}.runtime.parallel_module" in run.stdout


def test_an_import_loop_between_passes_fails(package_copy):
    # overlap.py is imported by fuse_reductions.py: the other way round closes a loop
    _add_import(
        package_copy, "program.passes.overlap", f"from {COPY}.program.passes import fuse_reductions"
    )
    run = _run(package_copy)
    assert run.returncode != 0
    assert f"No cycles are allowed in {COPY}.program.passes" in run.stdout
