"""torchrun worker: plan a model made of autoshard.local_map regions (tests/python/
local_map_models.py) on gloo ranks, train 3 SGD steps, and compare loss and parameters with
the single-process model.

Usage: torchrun --standalone --nproc-per-node 4 local_map_worker.py CONFIG.json OUT_DIR
Each scenario: {"name", "mesh": [4] or [2, 2], "runtime": "program" | "interpret"}.
Each rank writes OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # local_map_models
from local_map_models import DIM, RegionNet, init_reference  # noqa: E402
from scenario_runner import (full_parameters, parallel_step,  # noqa: E402
                             reference_step, run_scenarios)

from autoshard import AutoParallel  # noqa: E402
from autoshard.runtime.module_state import load_full_state_dict  # noqa: E402
from autoshard.runtime.module_runtime import runtime_of

BATCH = 8


def run_scenario(sc: dict) -> dict:
    shape = tuple(sc["mesh"])
    names = ("tp",) if len(shape) == 1 else ("dp", "tp")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    ref = init_reference()
    with torch.device("meta"):
        meta_model = RegionNet(mesh)
    g = torch.Generator().manual_seed(11)
    batches = [(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, DIM, generator=g))
               for _ in range(3)]
    with AutoParallel(meta_model, lambda: (torch.empty(BATCH, DIM), torch.empty(BATCH, DIM)),
                      mesh, strict=True, runtime=sc["runtime"], time_limit_s=8.0) as autop:
        lay = (Shard(0),) * len(shape)
        autop.add_input_constraints([lay, lay])
        plan = autop.optimize_placement()
        parallel = autop.apply_placement(plan)
    parallel.to_empty(device="cpu")
    load_full_state_dict(parallel, ref.state_dict())
    opt = torch.optim.SGD(parallel.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    steps = []
    for x in batches:
        loss = parallel_step(parallel, opt, x)
        ref_loss = reference_step(ref, ref_opt, x)
        params = {name: [full.flatten().tolist(), q.detach().flatten().tolist()]
                  for (name, full), q in zip(full_parameters(parallel), ref.parameters())}
        steps.append({"loss": float(loss.detach()), "ref_loss": float(ref_loss.detach()),
                      "params": params})
    nodes = plan.plan["nodes"]
    planned = {k: v for k, v in nodes.items() if k.startswith("local_map")}
    return {"name": sc["name"], "ok": True, "steps": steps, "planned": planned,
            "warnings": dict(runtime_of(parallel).runner.warnings)}


if __name__ == "__main__":
    sys.exit(run_scenarios(lambda sc, rank: run_scenario(sc)))
