#!/usr/bin/env python3
"""The first thing to run on a machine with a GPU (scripts/gpu_check.sh calls this).

Each check is one row of the table printed at the end:
- the tests that need a CUDA device (pytest marker ``cuda``; skipped everywhere else);
- ``autoshard demo --layers 2`` (planning only: runs on any machine);
- the Llama-style model (autoshard.models.Llama) planned on a 1-rank NCCL mesh and
  trained 3 SGD steps against the unsharded model: fp32 and bf16 mixed precision, runtime
  "program" (eager and compile=True) and "interpret";
- per step of the planned program: host syncs (values copied to the host:
  ``_local_scalar_dense`` and the ops that call it) and host-to-device copies, counted by a
  dispatch mode (and by the CUDA profiler where there is one);
- peak device memory after loading the weights and after a step;
- bench/block_overhead.py and bench/calibrate_compute.py at small sizes.

Without CUDA the rows that need it say "skipped (no CUDA)" and the rest run, so the script
itself is checked on CPU machines (tests/python/test_gpu_check.py). ``--device cpu`` runs
the model rows on CPU with gloo instead (to check this script without a GPU). The exit
code is 1 when a row failed, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIPPED = "skipped (no CUDA)"


@dataclass
class Row:
    check: str
    status: str  # ok | FAIL | WARN | skipped (...)
    detail: str = ""
    seconds: float = 0.0


# ---- subprocess checks ------------------------------------------------------------------------
def _run(cmd: list[str], timeout_s: float) -> tuple[int, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(timed out after {timeout_s:g} s)"
    return proc.returncode, proc.stdout + proc.stderr


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-n:])


def check_cuda_tests(quick: bool) -> Row:
    rc, out = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "cuda",
            "-p",
            "no:cacheprovider",
            str(REPO / "tests" / "python"),
        ],
        timeout_s=300,
    )
    if rc == 5:  # pytest: no tests collected
        return Row("pytest -m cuda", "ok", "no test is marked cuda")
    return Row("pytest -m cuda", "ok" if rc == 0 else "FAIL", _last_lines(out, 1 if rc == 0 else 4))


def check_demo(quick: bool) -> Row:
    cmd = [sys.executable, "-m", "autoshard.tools.cli", "demo", "--layers", "2"]
    if quick:
        cmd += ["--time-limit", "3"]
    rc, out = _run(cmd, timeout_s=300)
    if rc != 0:
        return Row("autoshard demo --layers 2", "FAIL", _last_lines(out, 4))
    return Row("autoshard demo --layers 2", "ok", _last_lines(out, 1))


def check_block_overhead(quick: bool) -> Row:
    cmd = [
        sys.executable,
        str(REPO / "bench" / "block_overhead.py"),
        "--dim",
        "256",
        "--hidden",
        "512",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--seq",
        "256",
        "--dtype",
        "bfloat16",
        "--iters",
        "5",
        "--warmup",
        "2",
    ]
    rc, out = _run(cmd, timeout_s=300)
    if rc != 0:
        return Row("bench/block_overhead.py (small)", "FAIL", _last_lines(out, 4))
    table = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    detail = "; ".join(
        f"{cells[0]} {cells[1]} (x{cells[2]})"
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table[1:])
    )
    return Row("bench/block_overhead.py (small)", "ok", detail)


def check_calibrate(quick: bool) -> Row:
    cmd = [
        sys.executable,
        str(REPO / "bench" / "calibrate_compute.py"),
        "--seq",
        "512",
        "--iters",
        "5",
        "--warmup",
        "2",
    ]
    rc, out = _run(cmd, timeout_s=180)
    if rc != 0:
        return Row("bench/calibrate_compute.py (small)", "FAIL", _last_lines(out, 4))
    total = next((line for line in out.splitlines() if line.startswith("total")), "")
    measured = next((line for line in out.splitlines() if line.startswith("measured on")), "")
    return Row("bench/calibrate_compute.py (small)", "ok", f"{measured}; {' '.join(total.split())}")


# ---- the Llama runs (in this process, on a 1-rank process group) -------------------------------
@dataclass
class Variant:
    dtype: str  # "fp32" | "bf16"
    runtime: str  # "program" | "interpret"
    compile: bool

    @property
    def name(self) -> str:
        comp = ", compile" if self.compile else ""
        mp = "bf16 mixed precision, sdpa" if self.dtype == "bf16" else "fp32"
        return f"Llama 1 rank: {mp}, {self.runtime}{comp}"


VARIANTS = [
    Variant(dtype, runtime, comp)
    for dtype in ("fp32", "bf16")
    for runtime, comp in (("program", False), ("program", True), ("interpret", False))
]
BATCH, SEQ, STEPS = 4, 32, 3
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}  # largest relative difference of loss and grads


def _llama_config(dtype: str):
    from autoshard.models import LlamaConfig

    # bf16: the manual attention adds an fp32 mask to the scores (promoting them to fp32,
    # whose matmul with bf16 values fails, in eager too); sdpa takes the causal flag instead
    return LlamaConfig(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=256,
        ffn_dim=128,
        max_seq_len=SEQ,
        attention="sdpa" if dtype == "bf16" else "manual",
    )


@contextlib.contextmanager
def _rope_in_input_dtype(enabled: bool):
    """autoshard.models.apply_rope multiplies by fp32 rotary tables, which turns
    bf16 queries and keys into fp32 ones (eager fails the same way): under bf16 mixed
    precision the result is cast back to the input's dtype, as Llama's own code does."""
    from autoshard import models

    if not enabled:
        yield
        return
    plain = models.apply_rope
    models.apply_rope = lambda x, cos, sin: plain(x, cos, sin).to(x.dtype)
    try:
        yield
    finally:
        models.apply_rope = plain


def _batch(step: int, device):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    seqs = torch.randint(0, 256, (BATCH, SEQ + 1), generator=g)
    return seqs[:, :-1].contiguous().to(device), seqs[:, 1:].contiguous().to(device)


def _rel_diff(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def build_planned(variant: Variant, mesh, device):
    """(planned module with the reference's weights, reference step, reference model)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from autoshard import AutoParallel, load_full_state_dict
    from autoshard.trace.mixed_precision import CastingStep, canonical_policy
    from autoshard.models import Llama

    cfg = _llama_config(variant.dtype)
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if variant.dtype == "bf16"
        else None
    )
    torch.manual_seed(0)
    ref = Llama(cfg).to(device)
    with torch.device("meta"):
        meta = Llama(cfg)

    def input_fn():  # as a user writes it: no device (the mesh's is used for tracing)
        return torch.empty(BATCH, SEQ, dtype=torch.long), torch.empty(BATCH, SEQ, dtype=torch.long)

    with AutoParallel(
        meta,
        input_fn,
        mesh,
        mp_policy=mp,
        runtime=variant.runtime,
        compile=variant.compile,
        time_limit_s=10.0,
    ) as autop:
        autop.optimize_placement()
        par = autop.apply_placement()
    par.to_empty(device=device)
    load_full_state_dict(par, ref.state_dict())
    reference = CastingStep(ref, canonical_policy(mp)) if mp is not None else ref
    return par, reference, ref


def run_variant(variant: Variant, mesh, device, profile: dict | None = None) -> Row:
    """STEPS SGD steps of the planned module and of the unsharded model on the same batches;
    the largest relative difference of the losses and gradients. ``profile``: filled with
    the memory peaks and the counts of host syncs and copies of one more step."""
    import torch

    from autoshard import local_inputs

    t0 = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    par, reference, ref = build_planned(variant, mesh, device)
    after_load = _peak_mib(device)
    opt_p = torch.optim.SGD(par.parameters(), lr=0.05)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.05)
    worst, after_step = 0.0, None
    for step in range(STEPS):
        tokens, labels = _batch(step, device)
        args, _ = local_inputs(par, tokens, labels)
        loss = par(*args)
        loss.backward()
        want = reference(tokens, labels)
        want.backward()
        worst = max(worst, _rel_diff(_full(loss), want))
        grads = dict(par.named_parameters())
        for name, p in ref.named_parameters():
            worst = max(worst, _rel_diff(_full(grads[name].grad), p.grad))
        for opt in (opt_p, opt_r):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if after_step is None:
            after_step = _peak_mib(device)
    if profile is not None:
        tokens, labels = _batch(STEPS, device)
        args, _ = local_inputs(par, tokens, labels)
        profile.update(count_step(lambda: par(*args).backward(), device))
        profile["after_load_mib"], profile["after_step_mib"] = after_load, after_step
        param_bytes = sum(p.numel() * p.element_size() for p in ref.parameters())
        profile["ref_param_mib"] = param_bytes / 2**20
    ok = worst <= TOLERANCE[variant.dtype]
    return Row(
        variant.name,
        "ok" if ok else "FAIL",
        f"max rel diff vs unsharded over {STEPS} steps {worst:.2e} (tolerance "
        f"{TOLERANCE[variant.dtype]:g})",
        time.perf_counter() - t0,
    )


def _peak_mib(device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def count_step(step, device) -> dict:
    """Host syncs and host-to-device copies in one call of ``step`` (a training step that
    reads no value: whatever syncs is the runtime's), seen by a dispatch mode; on CUDA
    also the profiler's count of synchronising CUDA calls and HtoD memcpys."""
    import torch

    counter = HostTraffic()
    with counter:
        step()
    counts = {"syncs": counter.syncs, "h2d": counter.h2d, "sync_ops": sorted(counter.sync_ops)}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        counts.update(_profiled(step, device))
    return counts


def _profiled(step, device) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize(device)
        names = [e.name for e in prof.events()]
    except Exception as e:  # the profiler is a diagnostic: its failure is reported, not fatal
        return {"profiler": f"profiler failed: {e}"}
    # the trailing synchronize above is the profile's own
    syncs = sum(n in ("cudaStreamSynchronize", "cudaEventSynchronize") for n in names)
    syncs += max(0, sum(n == "cudaDeviceSynchronize" for n in names) - 1)
    h2d = sum("HtoD" in n for n in names)
    return {"profiler": f"profiler: {syncs} synchronising CUDA calls, {h2d} HtoD memcpys"}


def _host_traffic_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    syncing = {
        aten._local_scalar_dense.default,
        aten.is_nonzero.default,
        aten.item.default,
        aten.equal.default,
        aten.allclose.default,
    }

    class HostTrafficMode(TorchDispatchMode):
        """Counts ops that copy a value to the host (``.item()``, ``bool(t)``, ``float(t)``)
        and copies from the host into a device tensor."""

        def __init__(self):
            super().__init__()
            self.syncs, self.h2d, self.sync_ops = 0, 0, set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in syncing:
                self.syncs += 1
                self.sync_ops.add(str(func))
            out = func(*args, **kwargs)
            if func in (aten._to_copy.default, aten.copy_.default):
                src = args[1] if func is aten.copy_.default else args[0]
                dst = args[0] if func is aten.copy_.default else out
                if _is_host(src) and not _is_host(dst):
                    self.h2d += 1
            return out

    return HostTrafficMode


def _is_host(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def HostTraffic():  # noqa: N802 (a class made on first use: torch is imported late)
    return _host_traffic_class()()


def check_llama(device_type: str, quick: bool) -> list[Row]:
    """Every variant in this process on a 1-rank process group (NCCL on CUDA, gloo on CPU),
    then the profile and memory rows from the fp32 program variant."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    rows = []
    profile: dict = {}
    try:
        mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
        variants = VARIANTS if not quick else VARIANTS[:1]
        for variant in variants:
            t0 = time.perf_counter()
            first = variant == VARIANTS[0]
            try:
                with _rope_in_input_dtype(variant.dtype == "bf16"):
                    row = run_variant(variant, mesh, device, profile if first else None)
                row.check += f" ({backend})"
            except Exception as e:
                row = Row(
                    f"{variant.name} ({backend})", "FAIL", _error(e), time.perf_counter() - t0
                )
            rows.append(row)
    finally:
        dist.destroy_process_group()
    rows.extend(_profile_rows(profile, device))
    return rows


def _profile_rows(profile: dict, device) -> list[Row]:
    if not profile:
        return [
            Row("host syncs / H2D copies per step", "FAIL", "the fp32 program run failed"),
            Row("peak memory", "FAIL", "the fp32 program run failed"),
        ]
    clean = profile["syncs"] == 0 and profile["h2d"] == 0
    detail = f"{profile['syncs']} host syncs, {profile['h2d']} host-to-device copies"
    if profile["sync_ops"]:
        detail += f" ({', '.join(profile['sync_ops'])})"
    if "profiler" in profile:
        detail += f"; {profile['profiler']}"
    kind = "max allocated" if device.type == "cuda" else "process peak RSS"
    memory = (
        f"{kind}: {profile['after_load_mib']:.1f} MiB after load, "
        f"{profile['after_step_mib']:.1f} MiB after a step (parameters "
        f"{profile['ref_param_mib']:.1f} MiB, unsharded reference included)"
    )
    return [
        Row("host syncs / H2D copies per step (fp32 program)", "ok" if clean else "WARN", detail),
        Row("peak memory (fp32 program)", "ok", memory),
    ]


def _error(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}{at}"


# ---- the table ---------------------------------------------------------------------------------
LLAMA_ROWS = [v.name + " (nccl)" for v in VARIANTS] + [
    "host syncs / H2D copies per step (fp32 program)",
    "peak memory (fp32 program)",
]


def print_table(rows: list[Row], header: str) -> None:
    width = max(len("check"), *(len(r.check) for r in rows))
    swidth = max(len("status"), *(len(r.status) for r in rows))
    print(f"\n{header}")
    print(f"| {'check':<{width}} | {'status':<{swidth}} | seconds | detail")
    print(f"|{'-' * (width + 2)}|{'-' * (swidth + 2)}|---------|-------")
    for r in rows:
        secs = f"{r.seconds:7.1f}" if r.seconds else "       "
        print(f"| {r.check:<{width}} | {r.status:<{swidth}} | {secs} | {r.detail}")


def _timed(fn, *args) -> Row | list[Row]:
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except Exception as e:
        return Row(fn.__name__, "FAIL", _error(e), time.perf_counter() - t0)
    if isinstance(out, Row) and not out.seconds:
        out.seconds = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="where the model rows run (auto: cuda when available, else skipped)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer variants and a shorter demo (the CPU self-test)"
    )
    args = ap.parse_args(argv)
    os.environ.setdefault("AUTOSHARD_CACHE_DIR", tempfile.mkdtemp(prefix="gpu_check_plans_"))
    import torch

    has_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not has_cuda:
        ap.error("--device cuda: torch.cuda.is_available() is False on this machine")
    model_device = {"auto": "cuda" if has_cuda else None, "cuda": "cuda", "cpu": "cpu"}[args.device]
    name = torch.cuda.get_device_name(0) if has_cuda else "no CUDA device"
    started = time.perf_counter()
    rows: list[Row] = []
    rows.append(
        _timed(check_cuda_tests, args.quick) if has_cuda else Row("pytest -m cuda", SKIPPED)
    )
    rows.append(_timed(check_demo, args.quick))
    if model_device is None:
        rows.extend(Row(check, SKIPPED) for check in LLAMA_ROWS)
    else:
        rows.extend(check_llama(model_device, args.quick))
    rows.append(
        _timed(check_block_overhead, args.quick)
        if has_cuda
        else Row("bench/block_overhead.py (small)", SKIPPED)
    )
    rows.append(_timed(check_calibrate, args.quick))
    print_table(
        rows,
        f"gpu_check: {name}; torch {torch.__version__}; " f"{time.perf_counter() - started:.0f} s",
    )
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
