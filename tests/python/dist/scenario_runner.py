"""The loop of the suite's torchrun workers: ``python worker.py CONFIG OUT_DIR`` runs every
scenario of the JSON list in CONFIG on this rank and writes the results to
OUT_DIR/rank<r>.json, which the pytest side (conftest.run_torchrun) reads. A scenario that
raises is recorded with its traceback and the others still run; the ranks meet after each
scenario so that one rank's failure cannot leave the others inside a collective of the next.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def run_scenarios(run_one: Callable[[dict, int], dict]) -> int:
    """``run_one(scenario, rank) -> result dict`` for each scenario; returns the exit code."""
    config_path, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(config_path) as f:
        scenarios = json.load(f)
    results = []
    for sc in scenarios:
        t0 = time.perf_counter()
        try:
            results.append(run_one(sc, rank))
        except Exception as e:  # recorded for the pytest side; other scenarios still run
            results.append(
                {
                    "name": sc["name"],
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
            )
        dist.barrier()
        # the suite's summary lists the slowest scenarios (conftest.pytest_terminal_summary)
        results[-1].setdefault("scenario_seconds", time.perf_counter() - t0)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.destroy_process_group()
    return 0


def parallel_step(parallel, opt, inputs) -> torch.Tensor:
    """One SGD step of the parallel module on this rank's part of the global ``inputs``."""
    from autoshard.runtime.module_state import local_inputs

    args, kwargs = local_inputs(parallel, *inputs)
    loss = parallel(*args, **kwargs)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def reference_step(ref, opt, inputs) -> torch.Tensor:
    """One SGD step of the single-process reference on the global ``inputs``; its loss."""
    loss = ref(*inputs)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def full_parameters(parallel) -> list[tuple[str, torch.Tensor]]:
    """(name, whole value) of each parameter of the parallel module (DTensors gathered)."""
    return [
        (n, (p.full_tensor() if isinstance(p, DTensor) else p).detach())
        for n, p in parallel.named_parameters()
    ]


def compare_parameters(parallel, ref, rtol: float, atol: float) -> dict:
    """How far the parallel module's parameters are from the reference's."""
    max_err, worst, all_close = 0.0, None, True
    for (n, full), q in zip(full_parameters(parallel), ref.parameters()):
        max_err = max(max_err, (full - q.detach()).abs().max().item())
        if not torch.allclose(full, q.detach(), rtol=rtol, atol=atol):
            all_close, worst = False, n
    return {"params_close": all_close, "max_param_err": max_err, "worst": worst}


def compare_losses(loss, ref_loss, rtol: float, atol: float) -> dict:
    """The two losses and whether they agree."""
    got, want = float(loss.detach()), float(ref_loss.detach())
    return {
        "loss": got,
        "ref_loss": want,
        "loss_close": math.isclose(got, want, rel_tol=rtol, abs_tol=atol),
    }


def sgd_steps_like_reference(parallel, ref, step_inputs, rtol: float, atol: float) -> list:
    """SGD steps (lr 0.1) of the parallel module and of the single-process reference, one per
    entry of ``step_inputs`` (global inputs); each step's loss and parameter comparison."""
    opt = torch.optim.SGD(parallel.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    steps = []
    for inputs in step_inputs:
        loss = parallel_step(parallel, opt, inputs)
        ref_loss = reference_step(ref, ref_opt, inputs)
        steps.append(
            {
                **compare_losses(loss, ref_loss, rtol, atol),
                **compare_parameters(parallel, ref, rtol, atol),
            }
        )
    return steps
