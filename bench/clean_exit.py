"""Do autoshard's training runs end cleanly? The same torchrun job, run again and again.

A job scheduler or CI pipeline reads a run's exit status: a rank that aborts at exit
("terminate called without an active exception") or dies mid-run fails the whole job even
when every loss was right. This runs one small training script (TinyGPT, hidden 32, planned
by autoshard with the default parameter budget, gloo ranks, SGD) ``--runs`` times in a row
under torchrun and counts the runs that end with rc 0, whose losses also match the
single-process model's (rtol 1e-5) on every step. Each run ends as a user's script does:
only rank 0 reads and prints the losses, then ``dist.destroy_process_group()``. With
``--gather-at-end`` every rank first gathers the full parameters (``full_tensor()``, as a
script that saves a full checkpoint does), so the last collectives complete a few
milliseconds before the interpreter ends: the window of the exit abort that
runtime/clean_exit.py closes. ``--exit-wait both`` alternates runs with autoshard's exit
hook and runs whose worker unregisters it, and counts each kind. ``--load N`` keeps N busy
processes running beside the runs, as on a machine that also runs a test suite (the abort
needs a worker thread left unscheduled for a few milliseconds).

    python3 bench/clean_exit.py --ranks 2 --runs 20 --steps 3
    python3 bench/clean_exit.py --ranks 3 --runs 20 --steps 3
    python3 bench/clean_exit.py --ranks 2 --runs 10 --steps 200
    python3 bench/clean_exit.py --ranks 2 --runs 60 --steps 1 --gather-at-end --exit-wait both
    python3 bench/clean_exit.py --ranks 2 --runs 60 --steps 1 --gather-at-end --exit-wait both \
        --load 2

``--trainer ARGS`` runs the example trainer instead (examples/train.py on
examples/llama_tiny.toml, ``--steps`` steps, a DCP checkpoint after the last one, ARGS
added, e.g. ``"--parallel.pp 2"`` for two pipeline stages); a run counts when it ends with
rc 0 after saving that checkpoint:

    python3 bench/clean_exit.py --trainer "--parallel.pp 2" --runs 20 --steps 2 --exit-wait both

The plan is solved in the first run and read from a plan cache (a temporary folder) after
that, unless ``--solve-every-run``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

DIM, HEADS, VOCAB, SEQ = 32, 4, 64, 8
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def worker(a) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from autoshard import AutoParallel
    from autoshard.runtime.module_state import load_full_state_dict, local_inputs
    from autoshard.models import TinyGPT

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ref = TinyGPT(DIM, HEADS, VOCAB)
    with torch.device("meta"):
        meta = TinyGPT(DIM, HEADS, VOCAB)
    batch = 2 * world
    shapes = [(batch, SEQ)] * 2
    with AutoParallel(
        meta,
        lambda: tuple(torch.empty(s, dtype=torch.long) for s in shapes),
        mesh,
        time_limit_s=5.0,
    ) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        autop.add_parameter_memory_constraint()
        parallel = autop.apply_placement(autop.optimize_placement())
    parallel.to_empty(device="cpu")
    load_full_state_dict(parallel, ref.state_dict())
    opt = torch.optim.SGD(parallel.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for step in range(a.steps):
        tokens, labels = (torch.randint(0, VOCAB, (batch, SEQ), generator=g) for _ in range(2))
        args, kwargs = local_inputs(parallel, tokens, labels)
        loss = parallel(*args, **kwargs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:  # as a user logs: rank 0 reads the loss, the others never do
            ref_loss = ref(tokens, labels)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            got, want = float(loss), float(ref_loss)
            worst = max(worst, abs(got - want) / max(abs(want), 1e-12))
    if a.gather_at_end:  # the full state, as a script that saves a full checkpoint
        for p in parallel.parameters():
            p.full_tensor()
    if a.exit_wait_off:
        _remove_exit_hook()
    if rank == 0:
        print(f"RESULT worst_rel_loss_err={worst:.3e}", flush=True)
    dist.destroy_process_group()


def trainer_worker(a) -> int:
    """The example trainer's main, run in this process; without the exit hook when asked."""
    import shlex

    sys.path.insert(0, str(EXAMPLES))
    import train

    argv = ["--config", str(EXAMPLES / "llama_tiny.toml"), "--training.steps", str(a.steps)]
    argv += ["--checkpoint.interval", str(a.steps), "--checkpoint.folder", a.folder]
    rc = train.main(argv + shlex.split(a.trainer))
    if a.exit_wait_off:
        _remove_exit_hook()
    return rc


def _remove_exit_hook() -> None:
    """What the hook prevents is measured with it removed."""
    import atexit

    from autoshard.runtime.clean_exit import wait_at_exit

    atexit.unregister(wait_at_exit)


def _one_run(a, cache: str, exit_wait: bool) -> tuple[int, float, str, bool, str]:
    """rc, seconds, why it failed, whether its numbers were right, and what they were."""
    # a rank killed by a signal prints every thread's Python stack (kept with --logs)
    env = dict(os.environ, OMP_NUM_THREADS="1", AUTOSHARD_CACHE_DIR=cache, PYTHONFAULTHANDLER="1")
    job = ["--worker", "--steps", str(a.steps)]
    job += ["--gather-at-end"] if a.gather_at_end else []
    job += [] if exit_wait else ["--exit-wait-off"]
    if a.trainer:  # its checkpoint goes to a folder of its own
        job += [f"--trainer={a.trainer}", f"--folder={tempfile.mkdtemp(dir=cache)}"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={a.ranks}",
        __file__,
        *job,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    seconds = time.perf_counter() - t0
    if a.trainer:  # the trainer ran every step when it saved the last step's checkpoint
        done = f"checkpoint: saved step {a.steps} " in proc.stdout + proc.stderr
        numbers = (done, "all steps" if done else "steps missing")
    else:
        err = None
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT worst_rel_loss_err="):
                err = float(line.split("=")[1])
        numbers = (
            err is not None and err <= 1e-5,
            f"worst loss error {'-' if err is None else f'{err:.1e}'}",
        )
    why = ""
    if proc.returncode != 0:
        if a.logs:
            os.makedirs(a.logs, exist_ok=True)
            with open(os.path.join(a.logs, f"failed_{time.time_ns()}.log"), "w") as f:
                f.write(proc.stdout + "\n" + proc.stderr)
        lines = [
            ln
            for ln in proc.stderr.splitlines()
            if any(k in ln for k in ("terminate", "Error", "Signal", "signal", "exitcode"))
        ]
        why = lines[0][:160] if lines else proc.stderr.strip().splitlines()[-1][:160]
    return proc.returncode, seconds, why, *numbers


def launch(a) -> int:
    kinds = {"on": [True], "off": [False], "both": [True, False]}[a.exit_wait]
    # busy processes beside the runs: a machine that also runs a test suite or a build
    burn = "import time\nwhile True: time.perf_counter()"
    load = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(a.load)]
    try:
        clean, runs = _runs(a, kinds)
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
    print()
    for kind in kinds:
        job = f"train.py {a.trainer}" if a.trainer else "TinyGPT"
        job += ", gather at end" if a.gather_at_end else ""
        job += f", {a.load} busy processes beside" if a.load else ""
        print(
            f"{job}, {a.ranks} ranks, {a.steps} steps, {'with' if kind else 'without'} "
            f"autoshard's exit hook: {clean[kind]} of {runs[kind]} runs ended with rc 0 and "
            + ("every step and checkpoint" if a.trainer else "losses equal to one process's")
        )
    return 0


def _runs(a, kinds: list[bool]) -> tuple[dict, dict]:
    """``--runs`` runs, cycling through ``kinds`` (with / without the exit hook); per kind,
    the runs that ended clean and the runs made."""
    clean = {kind: 0 for kind in kinds}
    runs = {kind: 0 for kind in kinds}
    with tempfile.TemporaryDirectory() as cache:
        for k in range(a.runs):
            exit_wait = kinds[k % len(kinds)]
            run_cache = tempfile.mkdtemp(dir=cache) if a.solve_every_run else cache
            rc, seconds, why, right, numbers = _one_run(a, run_cache, exit_wait)
            clean[exit_wait] += rc == 0 and right
            runs[exit_wait] += 1
            print(
                f"run {k + 1:3d} ({'with' if exit_wait else 'without'} exit hook): rc {rc}, "
                f"{seconds:6.1f} s, {numbers}{'  ' + why if why else ''}",
                flush=True,
            )
    return clean, runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument(
        "--solve-every-run",
        action="store_true",
        help="plan from scratch in every run (default: the first run's plan is cached)",
    )
    p.add_argument(
        "--logs", default="", metavar="DIR", help="write each failed run's output to DIR"
    )
    p.add_argument(
        "--gather-at-end",
        action="store_true",
        help="every rank gathers the full parameters just before the script ends",
    )
    p.add_argument(
        "--exit-wait",
        choices=("on", "off", "both"),
        default="on",
        help="autoshard's exit hook (runtime/clean_exit.py) kept, removed, or alternated",
    )
    p.add_argument(
        "--trainer",
        default="",
        metavar="ARGS",
        help='run examples/train.py with these extra arguments (e.g. "--parallel.pp 2")',
    )
    p.add_argument(
        "--load", type=int, default=0, metavar="N", help="N busy processes run beside the runs"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--exit-wait-off", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--folder", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.ranks < 1 or a.runs < 1 or a.steps < 1 or a.load < 0:
        p.error("--ranks, --runs and --steps must be at least 1, --load at least 0")
    if a.trainer and a.gather_at_end:
        p.error("--gather-at-end is for the TinyGPT job; the trainer ends with its checkpoint")
    if a.worker and a.trainer:
        return trainer_worker(a)
    if a.worker:
        worker(a)
        return 0
    return launch(a)


if __name__ == "__main__":
    sys.exit(main())
