"""torchrun worker: an 8-layer Llama-style model as a pipeline (autoshard.pipeline: each stage
planned by autoshard, wrapped as torch's PipelineStage, run by torch's schedules) on 4 gloo
ranks, trained 3 SGD steps with 4 microbatches; losses and parameters compared with the
single-process model under the same gradient accumulation.

Usage: torchrun --standalone --nproc-per-node 4 pipeline_worker.py CONFIG.json OUT_DIR
Scenario keys: mesh [pp, dp], schedule, virtual_stages, n_microbatches.
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from scenario_runner import run_scenarios

from autoshard.models import Llama, LlamaConfig
from autoshard.pipeline import plan_pipeline
from autoshard.progress import solver_result
from autoshard.runtime.module_runtime import runtime_of

RTOL, ATOL = 1e-5, 1e-6
BATCH, SEQ, STEPS, LR = 16, 8, 3, 0.1
CFG = LlamaConfig(
    dim=32, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=64, max_seq_len=SEQ
)


def batches():
    g = torch.Generator().manual_seed(7)
    return [
        tuple(torch.randint(0, CFG.vocab_size, (BATCH, SEQ), generator=g) for _ in range(2))
        for _ in range(STEPS)
    ]


def microbatches(x: torch.Tensor, dp: int, n_mb: int) -> list[torch.Tensor]:
    """Microbatch i of the whole batch as the pipeline sees it: each data-parallel rank
    splits its part of the batch into n_mb pieces, and the stage (planned over dp) reads
    piece i of every rank, rank by rank."""
    parts = [p.tensor_split(n_mb) for p in x.tensor_split(dp)]
    return [torch.cat([parts[d][i] for d in range(dp)]) for i in range(n_mb)]


def reference_run(model, data, dp: int, n_mb: int) -> list[list[float]]:
    """The single-process model under the pipeline's accumulation: per microbatch the mean
    loss's gradient, summed, divided by the number of microbatches (torch's scale_grads)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for tokens, labels in data:
        step = []
        for t, l in zip(microbatches(tokens, dp, n_mb), microbatches(labels, dp, n_mb)):
            loss = model(t, l)
            loss.backward()
            step.append(loss.item())
        for p in model.parameters():
            p.grad.div_(n_mb)
        opt.step()
        opt.zero_grad()
        losses.append(step)
    return losses


def run_scenario(sc: dict, rank: int) -> dict:
    pp, dp = sc["mesh"]
    n_mb = sc["n_microbatches"]
    result = {"name": sc["name"], "ok": False, "rank": rank}
    mesh = init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "dp"))
    torch.manual_seed(0)
    ref = Llama(CFG)
    with torch.device("meta"):
        meta_model = Llama(CFG)
    sample = tuple(torch.empty(BATCH, SEQ, dtype=torch.int64, device="meta") for _ in range(2))
    t0 = time.perf_counter()
    pipe = plan_pipeline(
        meta_model,
        mesh,
        sample,
        schedule=sc["schedule"],
        n_microbatches=n_mb,
        virtual_stages=sc.get("virtual_stages", 1),
        time_limit_s=8.0,
        capture=sc.get("capture", "dynamo"),
    )
    result["plan_seconds"] = time.perf_counter() - t0
    result["stages"] = [s.split.index for s in pipe.stages]
    result["solver"] = [
        {
            k: v
            for k, v in solver_result(runtime_of(s.parallel).plan).items()
            if k in ("solver_status", "solve_time_s", "planning_time_s")
        }
        | {"plan_seconds": runtime_of(s.parallel).plan.get("plan_seconds")}
        for s in pipe.stages
    ]
    result["stage_layers"] = [[r.start, r.stop] for r in pipe.stage_layers]
    pipe.to_empty(device="cpu")
    pipe.load_full_state_dict({k: v.clone() for k, v in ref.state_dict().items()})
    initial = {n: p.detach().clone() for n, p in ref.named_parameters()}
    result["layouts"] = {
        n: [str(x) for x in p.placements]
        for n, p in pipe.named_parameters()
        if isinstance(p, DTensor) and n.endswith(("wq.weight", "output.weight"))
    }
    opt = torch.optim.SGD(pipe.parameters(), lr=LR)
    data = batches()
    dp_rank = mesh.get_local_rank("dp")
    got = []
    t0 = time.perf_counter()
    for tokens, labels in data:
        losses: list = []
        pipe.step(
            tokens.tensor_split(dp)[dp_rank], target=labels.tensor_split(dp)[dp_rank], losses=losses
        )
        opt.step()
        opt.zero_grad()
        got.append([float(l) for l in losses])
    result["step_seconds"] = (time.perf_counter() - t0) / STEPS
    expected = reference_run(ref, data, dp, n_mb)
    has_last = any(s.split.is_last for s in pipe.stages)
    result["has_last"] = has_last
    if has_last:
        result["losses"], result["ref_losses"] = got, expected
        result["losses_close"] = all(
            torch.allclose(torch.tensor(a), torch.tensor(b), rtol=RTOL, atol=ATOL)
            for a, b in zip(got, expected)
        )
    ref_params = dict(ref.named_parameters())
    max_err, worst, close, names, moved = 0.0, None, True, [], 0.0
    for name, p in pipe.named_parameters():
        full = (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        q = ref_params[name].detach()
        names.append(name)
        moved = max(moved, (full - initial[name]).abs().max().item())
        max_err = max(max_err, (full - q).abs().max().item())
        if not torch.allclose(full, q, rtol=RTOL, atol=ATOL):
            close, worst = False, name
    result.update(
        params_close=close,
        max_param_err=max_err,
        worst=worst,
        param_names=names,
        max_param_change=moved,
    )
    result["ok"] = True
    return result


def main() -> int:
    logging.getLogger("torch").setLevel(logging.ERROR)
    return run_scenarios(run_scenario)


if __name__ == "__main__":
    sys.exit(main())
