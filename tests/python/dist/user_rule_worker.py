"""torchrun worker: plan a model with a user-registered custom op (tests/python/user_rule_ops.py)
on gloo ranks, train a few SGD steps, and compare loss and parameters with the single-process
model.

Usage: torchrun --standalone --nproc-per-node 2 user_rule_worker.py CONFIG.json OUT_DIR
Each scenario: {"name", "mesh", "pin": node names to pin to Shard(0) on every mesh dim,
"runtime": "program" | "interpret"}. Each rank writes OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # user_rule_ops
from user_rule_ops import RowScaleMLP, init_reference  # noqa: E402
from scenario_runner import (full_parameters, parallel_step,  # noqa: E402
                             reference_step, run_scenarios)

from autoshard import AutoParallel  # noqa: E402
from autoshard.runtime.module_state import load_full_state_dict  # noqa: E402
from autoshard.runtime.module_runtime import runtime_of


def run_scenario(sc: dict) -> dict:
    shape = tuple(sc["mesh"])
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple(f"d{i}" for i in range(len(shape))))
    ref = init_reference()
    with torch.device("meta"):
        meta_model = RowScaleMLP()
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)) for _ in range(3)]
    lay = (Shard(0),) * len(shape)  # batch rows split over every mesh dim
    with AutoParallel(meta_model, lambda: (torch.empty(8, 16), torch.empty(8, 16)), mesh,
                      strict=True, runtime=sc["runtime"], time_limit_s=8.0) as autop:
        autop.add_input_constraints([lay, lay])
        for name in sc["pin"]:
            autop.add_node_constraint(name, lay)
        plan = autop.optimize_placement()
        parallel = autop.apply_placement(plan)
    parallel.to_empty(device="cpu")
    load_full_state_dict(parallel, ref.state_dict())
    opt = torch.optim.SGD(parallel.parameters(), lr=0.01)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    steps = []
    for x in batches:
        loss = parallel_step(parallel, opt, x)
        ref_loss = reference_step(ref, ref_opt, x)
        worst = max((full - q.detach()).abs().max().item()
                    for (_, full), q in zip(full_parameters(parallel), ref.parameters()))
        steps.append({"loss": float(loss.detach()), "ref_loss": float(ref_loss.detach()),
                      "max_param_err": worst})
    nodes = plan.plan["nodes"]
    return {"name": sc["name"], "ok": True, "steps": steps,
            "planned": {k: nodes[k] for k in ("rowscale", "rowscale_backward")},
            "warnings": dict(runtime_of(parallel).runner.warnings)}


if __name__ == "__main__":
    sys.exit(run_scenarios(lambda sc, rank: run_scenario(sc)))
