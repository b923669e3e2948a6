"""Shared helpers: launching torchrun workers (gloo on CPU) from pytest, reading their
results, and a one-rank gloo mesh for single-process tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

DIST_DIR = Path(__file__).parent / "dist"
REPO = Path(__file__).resolve().parents[2]


def run_torchrun(
    script: str, config: list, tmp_path: Path, nproc: int = 4, timeout: float = 240.0
) -> list[list[dict]]:
    """Runs ``script CONFIG OUT`` under torchrun (--standalone picks a free port) and
    returns each rank's result list. Fails the test with the workers' output on error.

    A run in which a worker was killed by a signal (SIGSEGV, SIGABRT, SIGBUS) is run once
    more, with a warning that keeps the first run's output. Two kinds were seen:
    - heap corruption found by gloo's TCP loop thread mid-run (not seen since at most one
      collective is in flight on gloo, program/passes/in_flight.py);
    - "terminate called without an active exception" at interpreter exit, after every rank
      wrote its results: a gloo worker thread taking the GIL once the interpreter was
      finalizing (3 of 60 runs of test_runtime_hf's worker). autoshard's exit hook
      (runtime/clean_exit.py) closes that window: 0 of 60 since.
    A clean second run tells a crash apart from a failure of the code under test; a second
    crash fails the test."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # A worker killed by a signal (abort, segfault) prints every thread's Python stack.
    env["PYTHONFAULTHANDLER"] = "1"
    for attempt in (1, 2):
        out = tmp_path / f"out{attempt}"
        out.mkdir()
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(DIST_DIR / script),
            str(cfg),
            str(out),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 0:
            results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
            _record_scenario_seconds(script, results)
            return results
        written = sorted(p.name for p in out.iterdir())
        report = (
            f"torchrun failed ({proc.returncode}); result files written: {written}\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-12000:]}"
        )
        if attempt == 1 and _SIGNAL_DEATH.search(proc.stderr):
            warnings.warn(f"{script}: a worker died by a signal; running once more.\n{report}")
            continue
        pytest.fail(report)
    raise AssertionError("unreachable")


# (seconds, worker script, scenario) of every torchrun scenario this session ran, on rank 0
_SCENARIO_SECONDS: list[tuple[float, str, str]] = []


def _record_scenario_seconds(script: str, results: list[list[dict]]) -> None:
    for r in results[0] if results else []:
        if isinstance(r, dict) and "scenario_seconds" in r:
            _SCENARIO_SECONDS.append((r["scenario_seconds"], script, r.get("name", "?")))


def pytest_terminal_summary(terminalreporter):
    """The slowest torchrun scenarios (pytest's --durations shows a launch as one test or
    fixture, which may hold a dozen scenarios): where the suite's minutes go."""
    if not _SCENARIO_SECONDS:
        return
    terminalreporter.section("slowest torchrun scenarios (rank 0)")
    for seconds, script, name in sorted(_SCENARIO_SECONDS, reverse=True)[:20]:
        terminalreporter.write_line(f"{seconds:8.2f}s  {script} :: {name}")
    total = sum(s for s, _, _ in _SCENARIO_SECONDS)
    terminalreporter.write_line(f"{total:8.2f}s  in all, {len(_SCENARIO_SECONDS)} scenarios")


# torchrun's line for the first worker to fail, when a crash killed it (SIGABRT, SIGBUS,
# SIGSEGV): "failed (exitcode: -11) local_rank: 3 (pid: 123)"
_SIGNAL_DEATH = re.compile(r"failed \(exitcode: -(6|7|11)\) local_rank")


def by_name(results: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in results}


def ok_on_every_rank(results: list[list[dict]], name: str) -> list[dict]:
    """Scenario ``name``'s result on each rank; fails naming the rank and its error when a
    rank did not complete it."""
    out = []
    for rank, res in enumerate(results):
        r = by_name(res)[name]
        assert r["ok"], f"rank {rank}: {r.get('traceback', r.get('error'))}"
        out.append(r)
    return out


def assert_attention_split_on_virtual_8x8(model, inputs, op_prefix: str, n_calls: int) -> int:
    """Plans ``model`` on ``inputs`` (a tuple or a function returning one) on a virtual 8x8
    (dp, tp) mesh with the batch on dp, and checks that every attention node (``op_prefix``,
    ``n_calls`` of them) takes q split on some mesh dim (by batch or heads), not replicated.
    Returns the number of input tensors, as the trace flattens the inputs."""
    import torch
    from torch.distributed.tensor import Replicate, Shard

    from autoshard import AutoParallel
    from autoshard.ops.flex_attention import register_block_mask_pytree
    from autoshard.trace.fake_pg import fake_world

    register_block_mask_pytree()  # as the trace does: a BlockMask input is its tensors
    leaves = torch.utils._pytree.tree_leaves(inputs() if callable(inputs) else inputs)
    with fake_world((8, 8), ("dp", "tp")) as mesh:
        with AutoParallel(model, inputs, mesh) as autop:
            autop.add_input_constraints([(Shard(0), Replicate())] + [None] * (len(leaves) - 1))
            plan = autop.optimize_placement().plan
    calls = {n: e for n, e in plan["nodes"].items() if n.startswith(op_prefix)}
    assert len(calls) == n_calls, sorted(calls)
    for name, entry in calls.items():
        q = entry["inputs"][0]
        assert set(q) <= {"R", "S(0)", "S(1)"} and q != ["R", "R"], (name, q)
    return len(leaves)


def trained_like_reference(results: list[list[dict]], name: str) -> list[dict]:
    """Scenario ``name``'s result on each rank, failing unless every rank completed it with
    each step's loss and parameters close to the single-process reference's (the workers'
    ``steps``, scenario_runner.compare_losses / compare_parameters)."""
    out = ok_on_every_rank(results, name)
    for rank, r in enumerate(out):
        for i, s in enumerate(r["steps"]):
            assert s["loss_close"], f"rank {rank} step {i}: loss {s['loss']} vs {s['ref_loss']}"
            assert s["params_close"], f"rank {rank} step {i}: {s['worst']} {s['max_param_err']}"
    return out


@pytest.fixture(scope="module")
def mesh1():
    """A one-rank gloo process group and its (1,) CPU mesh, for the tests of one module."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session", autouse=True)
def _session_plan_cache(tmp_path_factory):
    """No test reads or fills the user's plan cache (~/.cache/autoshard/plans): the session
    (and the torchrun workers it starts, which inherit the environment) caches plans in a
    fresh temporary folder."""
    saved = os.environ.get("AUTOSHARD_CACHE_DIR")
    os.environ["AUTOSHARD_CACHE_DIR"] = str(tmp_path_factory.mktemp("plan_cache"))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("AUTOSHARD_CACHE_DIR", None)
        else:
            os.environ["AUTOSHARD_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def _plan_cache_per_test(tmp_path_factory, monkeypatch):
    """Each test starts with an empty plan cache of its own, so no test sees another's plans
    (a plan from the cache skips the solver)."""
    monkeypatch.setenv("AUTOSHARD_CACHE_DIR", str(tmp_path_factory.mktemp("plan_cache")))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run on a real CUDA device only (scripts/gpu_check.sh runs them
    with ``-m cuda``); elsewhere they are reported as skipped, not deleted."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:  # the mark, not a "cuda" param id
            item.add_marker(skip)
