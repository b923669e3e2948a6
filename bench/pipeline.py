#!/usr/bin/env python3
"""A pipeline planned by autoshard against the same pipeline written by hand, side by side in
one run: the same Llama-style model, global batch, stage split, microbatches and torch
schedule on the same gloo ranks.

- autoshard: ``autoshard.pipeline.plan_pipeline`` (each stage planned by autoshard on its
  data-parallel ranks, run as a lowered per-rank program inside torch's PipelineStage).
- hand: the same stage modules with FSDP2 (``fully_shard`` per layer and on the stage) over
  the data-parallel ranks where dp > 1, wrapped in torch's PipelineStage and driven by the
  same schedule class: what a torchtitan user writes.

Each variant's step is timed on every rank (the slowest rank counts), best of interleaved
rounds; the first step's losses are compared so both compute the same thing.

    python3 bench/pipeline.py                                   # pp=2 x dp=2, 1F1B
    python3 bench/pipeline.py --pp 4 --dp 1 --schedule Interleaved1F1B --virtual-stages 2
    python3 bench/pipeline.py --dim 256 --layers 8 --seq 128 --batch 16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--schedule", default="1F1B", choices=["GPipe", "1F1B", "Interleaved1F1B"])
    p.add_argument("--virtual-stages", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="global batch (all dp ranks)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.batch % (a.dp * a.microbatches):
        p.error(
            f"--batch {a.batch} must split into {a.dp} dp parts of {a.microbatches} microbatches"
        )
    if a.virtual_stages > 1 and a.schedule != "Interleaved1F1B":
        p.error("--virtual-stages > 1 needs --schedule Interleaved1F1B")
    return a


def config(a):
    from autoshard.models import LlamaConfig

    return LlamaConfig(
        dim=a.dim,
        n_layers=a.layers,
        n_heads=a.heads,
        n_kv_heads=a.heads,
        vocab_size=a.vocab,
        ffn_dim=2 * a.dim,
        max_seq_len=a.seq,
        attention="sdpa",
    )


def data(a) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return tuple(torch.randint(0, a.vocab, (a.batch, a.seq), generator=g) for _ in range(2))


def autoshard_pipeline(a, mesh, state: dict):
    from autoshard.models import Llama
    from autoshard.pipeline import plan_pipeline

    with torch.device("meta"):
        model = Llama(config(a))
    sample = tuple(torch.empty(a.batch, a.seq, dtype=torch.long, device="meta") for _ in range(2))
    pipe = plan_pipeline(
        model,
        mesh,
        sample,
        schedule=a.schedule,
        n_microbatches=a.microbatches,
        virtual_stages=a.virtual_stages,
        hardware="CPU",
    )
    pipe.to_empty(device="cpu")
    pipe.load_full_state_dict(state)

    def step(x, target, losses):
        pipe.step(x, target=target, losses=losses)

    return step, list(pipe.parameters())


def _loss_is_output(output, target):
    return output  # the last stage computes the loss itself, as autoshard's does


def hand_pipeline(a, mesh, state: dict):
    """torch.distributed.pipelining + FSDP2 by hand, on autoshard's stage modules (plain
    torch modules: the split is the same, the parallelism is the hand's)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    from autoshard.models import Llama
    from autoshard.pipeline.stage_modules import split_model
    from autoshard.pipeline.stage_runtime import StageCall
    from autoshard.pipeline.stage_split import layer_ranges

    model = Llama(config(a))
    model.load_state_dict(state)
    n_stages = a.pp * a.virtual_stages
    pp_rank = mesh.get_local_rank("pp")
    splits = split_model(model, layer_ranges(a.layers, n_stages, None))
    stages, params = [], []
    for s in splits:
        if s.index % a.pp != pp_rank:
            continue
        module = s.module
        if a.dp > 1:
            for layer in module.layers:
                fully_shard(layer, mesh=mesh["dp"])
            fully_shard(module, mesh=mesh["dp"])
        params += list(module.parameters())
        call = StageCall(module, s.is_last)
        stages.append(
            PipelineStage(call, s.index, n_stages, torch.device("cpu"), group=mesh.get_group("pp"))
        )
    cls = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B, "Interleaved1F1B": ScheduleInterleaved1F1B}
    multi = a.schedule == "Interleaved1F1B"
    sched = cls[a.schedule](
        stages if multi else stages[0], n_microbatches=a.microbatches, loss_fn=_loss_is_output
    )

    def step(x, target, losses):
        sched.step(x, target=target, losses=losses, labels=target, return_outputs=False)

    return step, params


def _timed(step, params, x, y) -> tuple[float, list]:
    import torch.distributed as dist

    opt = torch.optim.SGD(params, lr=1e-3)
    losses: list = []
    dist.barrier()
    t0 = time.perf_counter()
    step(x, y, losses)
    opt.step()
    opt.zero_grad()
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed), [float(l) for l in losses]


def worker(a) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.models import Llama

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (a.pp, a.dp), mesh_dim_names=("pp", "dp"))
    torch.manual_seed(0)
    state = Llama(config(a)).state_dict()
    tokens, labels = data(a)
    dp_rank = mesh.get_local_rank("dp")
    x, y = tokens.tensor_split(a.dp)[dp_rank], labels.tensor_split(a.dp)[dp_rank]
    out: dict = {}
    variants = {}
    for name, build in (("autoshard", autoshard_pipeline), ("hand", hand_pipeline)):
        t0 = time.perf_counter()
        variants[name] = build(a, mesh, {k: v.clone() for k, v in state.items()})
        out[name] = {"build_s": time.perf_counter() - t0, "rounds_s": []}
        _, out[name]["first_losses"] = _timed(*variants[name], x, y)
        for _ in range(a.warmup - 1):
            _timed(*variants[name], x, y)
    for _ in range(a.rounds):
        for name, (step, params) in variants.items():
            t = sum(_timed(step, params, x, y)[0] for _ in range(a.steps)) / a.steps
            out[name]["rounds_s"].append(t)
    # autoshard's last stage reports each microbatch's loss over the whole microbatch (on
    # every dp rank); FSDP2's, each dp rank's own part: the step's mean loss is comparable
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {n: out[n]["first_losses"] for n in variants})
    if dist.get_rank() == 0:
        for n in variants:
            values = [v for g in gathered for v in g[n]]
            out[n]["first_step_mean_loss"] = sum(values) / len(values)
        with open(a.out, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def launch(a) -> None:
    from torchrun_launch import run_workers

    res = run_workers(__file__, a.pp * a.dp, a)
    print(
        f"model: Llama-style, dim {a.dim}, {a.layers} layers, {a.heads} heads, seq {a.seq}, "
        f"vocab {a.vocab}; global batch {a.batch}; mesh pp={a.pp} x dp={a.dp}; {a.schedule}"
        f" ({a.virtual_stages} stage(s) per rank), {a.microbatches} microbatches; gloo, one "
        f"thread per rank; mean of {a.steps} steps after {a.warmup}, best of {a.rounds} rounds\n"
    )
    print("| variant | step (s) | build (s) | first step's mean loss |")
    print("|---|---:|---:|---|")
    best = {}
    for name in ("autoshard", "hand"):
        r = res[name]
        best[name] = min(r["rounds_s"])
        loss = r["first_step_mean_loss"]
        print(f"| {name} | {best[name]:.4f} | {r['build_s']:.1f} | {loss:.6f} |")
    print(f"\nautoshard / hand: {best['autoshard'] / best['hand']:.3f}x")


def main(argv=None) -> int:
    a = parse(argv)
    if a.worker:
        worker(a)
    else:
        launch(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
