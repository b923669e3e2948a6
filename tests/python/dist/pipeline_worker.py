"""torchrun worker: an 8-layer Llama-style model as a pipeline (autoshard.pipeline: each stage
planned by autoshard, wrapped as torch's PipelineStage, run by torch's schedules) on 4 gloo
ranks, trained 3 SGD steps with 4 microbatches; losses and parameters compared with the
single-process model under the same gradient accumulation.

The communication that runs is counted (after the first step, whose shape inference has
sends of its own): every isend / irecv (torch's PipelineStage sends through them) and every
collective reaching the dispatcher, against what the plan says: a send and a receive per
microbatch and stage boundary in each direction, and each stage program's collective nodes
once per microbatch.

Usage: torchrun --standalone --nproc-per-node 4 pipeline_worker.py CONFIG.json OUT_DIR
Scenario keys: mesh [pp, dp] or "auto", schedule, virtual_stages, n_microbatches (None: the
planner chooses).
"""

from __future__ import annotations

import logging
import sys
import time

from collections import Counter
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed.checkpoint as dcp
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from scenario_runner import run_scenarios

from autoshard.models import Llama, LlamaConfig
from autoshard.pipeline import plan_pipeline
from autoshard.progress import solver_result

RTOL, ATOL = 1e-5, 1e-6
BATCH, SEQ, STEPS, LR = 16, 8, 3, 0.1
CFG = LlamaConfig(
    dim=32, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=64, max_seq_len=SEQ
)


COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")


def _collective_kind(name: str) -> str | None:
    return next((c for c in COLLECTIVES if c in name.replace("allgather", "all_gather")), None)


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives (by kind) that reach the dispatcher; waits and sends are not
    collectives."""

    def __init__(self):
        super().__init__()
        self.kinds: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("_c10d_functional", "c10d_functional", "c10d"):
            kind = _collective_kind(func._schema.name.split("::")[-1])
            if kind:
                self.kinds[kind] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting_p2p(counts: Counter):
    """isend / irecv counted (torch's P2POp checks its op against c10d's own names, so both
    bindings are replaced by the same counting function)."""
    real = {"isend": c10d.isend, "irecv": c10d.irecv}

    def counted(name):
        def op(*args, **kwargs):
            counts[name] += 1
            return real[name](*args, **kwargs)

        return op

    wrapped = {name: counted(name) for name in real}
    try:
        for name, fn in wrapped.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        yield counts
    finally:
        for name, fn in real.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)


def planned_collectives(pipe) -> Counter:
    """The collectives one microbatch runs on this rank: the collective nodes of its stages'
    forward and backward programs."""
    out: Counter = Counter()
    for s in pipe.stages:
        if s.as_written:  # a one-rank stage run as written: no program, no collectives
            continue
        for gm in (s.parallel.parallel_gm, s.parallel.parallel_bwd_gm):
            for n in gm.graph.nodes:
                name = getattr(n.target, "__name__", str(n.target))
                kind = _collective_kind(name) if n.op == "call_function" else None
                if kind:
                    out[kind] += 1
    return out


def planned_p2p(pipe) -> int:
    """Sends (and as many receives) one microbatch makes on this rank: an activation forward
    from every stage but the last, a gradient back from every stage but the first."""
    return sum((not s.split.is_last) + (not s.split.is_first) for s in pipe.stages)


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
    result = {"name": sc["name"], "ok": False, "rank": rank}
    if sc["mesh"] == "auto":
        mesh = "auto"
    else:
        mesh = init_device_mesh("cpu", tuple(sc["mesh"]), mesh_dim_names=("pp", "dp"))
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
        schedule=sc.get("schedule"),
        n_microbatches=sc.get("n_microbatches"),
        virtual_stages=sc.get("virtual_stages"),
        world_size=sc.get("world_size"),
        time_limit_s=8.0,
        capture=sc.get("capture", "dynamo"),
    )
    result["plan_seconds"] = time.perf_counter() - t0
    mesh, n_mb = pipe.mesh, pipe.n_microbatches
    pp, dp = mesh.size(0), mesh.size(1)
    result["mesh"] = [pp, dp]
    result["n_microbatches"] = n_mb
    result["schedule"] = type(pipe.schedule).__name__
    if pipe.choice is not None:
        result["choice"] = pipe.choice.report(5)
    result["stages"] = [s.split.index for s in pipe.stages]
    result["solver"] = [
        {
            k: v
            for k, v in solver_result(s.plan).items()
            if k in ("solver_status", "solve_time_s", "planning_time_s")
        }
        | {"plan_seconds": s.plan.get("plan_seconds"), "as_written": s.as_written}
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
    if sc.get("load_checkpoint"):
        result["checkpoint"] = load_other_split(pipe, sc["load_checkpoint"])
        pipe.load_full_state_dict({k: v.clone() for k, v in ref.state_dict().items()})
    opt = torch.optim.SGD(pipe.parameters(), lr=LR)
    data = batches()
    dp_rank = mesh.get_local_rank("dp")
    got = []
    p2p, collectives = Counter(), CollectiveCounter()
    t0 = time.perf_counter()
    for i, (tokens, labels) in enumerate(data):
        losses: list = []
        with counting_p2p(p2p) if i else nullcontext(), collectives if i else nullcontext():
            pipe.step(
                tokens.tensor_split(dp)[dp_rank],
                target=labels.tensor_split(dp)[dp_rank],
                losses=losses,
            )
        opt.step()
        opt.zero_grad()
        got.append([float(l) for l in losses])
    result["step_seconds"] = (time.perf_counter() - t0) / STEPS
    counted_steps = STEPS - 1
    result["p2p_ran"] = dict(p2p)
    result["p2p_planned"] = {
        k: counted_steps * n_mb * planned_p2p(pipe) for k in ("isend", "irecv")
    }
    result["collectives_ran"] = dict(collectives.kinds)
    result["collectives_planned"] = {
        k: counted_steps * n_mb * v for k, v in planned_collectives(pipe).items()
    }
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
    if sc.get("save_checkpoint"):
        dcp.save(pipe.state_dict(), checkpoint_id=sc["save_checkpoint"])
    result["ok"] = True
    return result


def load_other_split(pipe, saved: dict) -> dict:
    """Load a checkpoint another split saved (``saved``: its path and the dp and
    microbatches it trained with) into ``pipe`` by DCP; its parameters must be that run's
    trained ones, i.e. the single-process model's after the same steps."""
    state = pipe.state_dict()
    dcp.load(state, checkpoint_id=saved["path"])
    torch.manual_seed(0)
    trained = Llama(CFG)
    reference_run(trained, batches(), saved["dp"], saved["n_microbatches"])
    want = dict(trained.named_parameters())
    err = 0.0
    for name, t in state.items():
        full = (t.full_tensor() if isinstance(t, DTensor) else t).detach()
        err = max(err, (full - want[name].detach()).abs().max().item())
    return {"names": len(state), "max_err": err}


def main() -> int:
    logging.getLogger("torch").setLevel(logging.ERROR)
    return run_scenarios(run_scenario)


if __name__ == "__main__":
    sys.exit(main())
