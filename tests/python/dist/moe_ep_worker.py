"""torchrun worker: a DeepSeek-style MoE block (models_zoo.DeepSeekMoEBlock) planned freely on a
(dp, ep) mesh under the default parameter budget, trained a few SGD steps on every gloo rank
and compared with the single-process model. Records the plan's expert-weight layouts, the
redistributions the plan implies (an all-to-all where tokens move between group-major and
expert-major layouts), the collectives of the lowered program and those that really ran.

Usage: torchrun --standalone --nproc-per-node 4 moe_ep_worker.py CONFIG.json OUT_DIR
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

import comm_count_worker
from comm_count_worker import CollectiveRecorder, planned_redistributions
from scenario_runner import (compare_losses, compare_parameters, reference_step,
                             run_scenarios)
from train_worker import ATOL, RTOL, layouts_by_fqn, param_fraction

from autoshard.runtime.module_state import load_full_state_dict, local_inputs
from autoshard._testing.models_zoo import DeepSeekMoEBlock
from autoshard.runtime.module_runtime import runtime_of


# the lowered program all-reduces into a buffer nothing else reads (program/lowering.py: all_reduce_)
comm_count_worker._KIND_OF_OP.setdefault("all_reduce_", "all_reduce")


def make_model(sc: dict) -> DeepSeekMoEBlock:
    return DeepSeekMoEBlock(**sc["model"])


def run(sc: dict, rank: int) -> dict:
    from autoshard.api.autoparallel import AutoParallel

    mesh_shape = tuple(sc["mesh"])
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=tuple(sc["dim_names"]))
    torch.manual_seed(1234)
    ref = make_model(sc)
    with torch.device("meta"):
        meta_model = make_model(sc)
    shape = tuple(sc["input_shape"])
    inputs = []
    for i in range(sc.get("steps", 3)):
        g = torch.Generator().manual_seed(100 + i)
        inputs.append((torch.randn(shape, generator=g), torch.randn(shape, generator=g)))
    t0 = time.perf_counter()
    with AutoParallel(meta_model, lambda: (torch.empty(shape), torch.empty(shape)), mesh,
                      strict=True, capture="direct", hardware=sc.get("hardware", "CPU"),
                      time_limit_s=sc.get("time_limit_s", 8.0),
                      runtime=sc.get("runtime", "program")) as autop:
        autop.add_input_constraints([(Shard(0),) + (Replicate(),) * (len(mesh_shape) - 1)] * 2)
        autop.add_parameter_memory_constraint()  # the default budget: 1 / mesh size
        plan = autop.optimize_placement(verbose=False)
        parallel = autop.apply_placement(plan)
        step = autop.step
    result: dict = {"name": sc["name"], "ok": False, "report": plan.get("report", ""),
                    "plan_seconds": time.perf_counter() - t0}
    planned = planned_redistributions(step, plan)
    result["planned"] = [{k: p[k] for k in ("where", "kind", "mesh_dim", "src", "dst", "shape")}
                         for p in planned]
    result["planned_ops"] = {p["where"]: str(n.target) for n in step.gm.graph.nodes
                             for p in planned if n.name == p["where"]}
    parallel.to_empty(device="cpu")
    load_full_state_dict(parallel, ref.state_dict())
    result["param_fraction"] = param_fraction(parallel)
    result["layouts"] = layouts_by_fqn(parallel)
    opt = torch.optim.SGD(parallel.parameters(), lr=sc.get("lr", 0.1))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=sc.get("lr", 0.1))
    program = sc.get("runtime", "program") == "program"
    if program:
        parallel.parallel_gm  # lowered before the recorder runs
        result["program_collectives"] = [
            {k: c[k] for k in ("phase", "op", "where", "numel")}
            for c in runtime_of(parallel).program.collectives()]
    steps = []
    for i, x in enumerate(inputs):
        a, k = local_inputs(parallel, *x)
        recorder = CollectiveRecorder()
        with recorder:
            loss = parallel(*a, **k)
            loss.backward()
        if i == 0:
            result["executed"] = [{"kind": c["kind"], "op": c["op"], "numel": c["numel"]}
                                  for c in recorder.calls]
            if program:
                # (all_reduce and its in-place form all_reduce_ alike)
                listed = sorted((c["op"].rstrip("_"), c["numel"])
                                for c in result["program_collectives"])
                result["executed_as_listed"] = listed == sorted(
                    (c["op"].rstrip("_"), c["numel"]) for c in recorder.calls)
        grad_layouts_ok = all(p.grad is None or tuple(p.grad.placements) == tuple(p.placements)
                              for p in parallel.parameters())
        opt.step()
        opt.zero_grad()
        ref_loss = reference_step(ref, ref_opt, x)
        steps.append({**compare_losses(loss, ref_loss, RTOL, ATOL),
                      "grad_layouts_ok": grad_layouts_ok,
                      **compare_parameters(parallel, ref, RTOL, ATOL)})
    result["steps"] = steps
    result["ok"] = True
    return result


def main() -> int:
    logging.getLogger("torch").setLevel(logging.ERROR)
    return run_scenarios(run)


if __name__ == "__main__":
    sys.exit(main())
