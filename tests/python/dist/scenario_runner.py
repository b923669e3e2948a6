"""The loop of the suite's torchrun workers: ``python worker.py CONFIG OUT_DIR`` runs every
scenario of the JSON list in CONFIG on this rank and writes the results to
OUT_DIR/rank<r>.json, which the pytest side (conftest.run_torchrun) reads. A scenario that
raises is recorded with its traceback and the others still run; the ranks meet after each
scenario so that one rank's failure cannot leave the others inside a collective of the next.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Callable

import torch.distributed as dist


def run_scenarios(run_one: Callable[[dict, int], dict]) -> int:
    """``run_one(scenario, rank) -> result dict`` for each scenario; returns the exit code."""
    config_path, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(config_path) as f:
        scenarios = json.load(f)
    results = []
    for sc in scenarios:
        try:
            results.append(run_one(sc, rank))
        except Exception as e:  # recorded for the pytest side; other scenarios still run
            results.append({"name": sc["name"], "ok": False, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()})
        dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.destroy_process_group()
    return 0
