"""torchrun worker: the plan cache on a real multi-rank group (gloo).

Usage: torchrun --standalone --nproc-per-node 2 plan_cache_worker.py CONFIG.json OUT_DIR
CONFIG: {"cache_dir": DIR}. Scenarios, in order, each planning the same MLP:
  "first"     every rank caches in DIR (one folder, as on one machine): a miss; rank 0
              plans, stores and broadcasts;
  "again"     the same request: every rank finds the same entry, so each loads its own
              and the solver does not run anywhere;
  "own_dirs"  rank 0 caches in DIR, the others in an empty folder of their own: rank 0's
              cached plan is broadcast, still without solving;
  "mixed"     rank 0 caches, the others pass plan_cache=False: no rank hangs.
Per scenario each rank records the planner calls it made, the cache marker and a digest of
its plan; OUT_DIR/rank<r>.json is the list of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard

from autoshard import AutoParallel, _core
from autoshard.models import MLP

CALLS = []
_real_plan_graph = _core.plan_graph


def _counting_plan_graph(graph, options):
    CALLS.append(1)
    return _real_plan_graph(graph, options)


_core.plan_graph = _counting_plan_graph


def plan_once(mesh, cache) -> dict:
    with torch.device("meta"):
        model = MLP(16, 32, 2)
    with AutoParallel(model, lambda: (torch.empty(8, 16), torch.empty(8, 16)), mesh,
                      time_limit_s=5.0, capture="direct", hardware="CPU",
                      plan_cache=cache) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        return autop.optimize_placement().plan


def main() -> int:
    config_path, out_dir = sys.argv[1], sys.argv[2]
    with open(config_path) as f:
        config = json.load(f)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    shared = config["cache_dir"]
    own = os.path.join(shared, f"rank{rank}-own")
    settings = {"first": shared, "again": shared,
                "own_dirs": shared if rank == 0 else own,
                "mixed": shared if rank == 0 else False}
    results = []
    for name, cache in settings.items():
        before = len(CALLS)
        try:
            plan = plan_once(mesh, cache)
            marker = plan.get("plan_cache")
            body = {k: v for k, v in plan.items() if k not in ("plan_cache", "plan_seconds")}
            digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
            results.append({"name": name, "ok": True, "solver_calls": len(CALLS) - before,
                            "marker": marker, "digest": digest})
        except Exception as e:  # reported, not raised: the other scenarios still run
            results.append({"name": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
