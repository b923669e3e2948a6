"""Train a small Llama-style model with autoshard, one process per rank (torchrun).

    torchrun --nproc_per_node 2 examples/train.py --config examples/llama_tiny.toml
    torchrun --nproc_per_node 2 examples/train.py --config examples/llama_tiny.toml \
        --data.path README.md --parallel.preset ddp --training.steps 40
    torchrun --nproc_per_node 4 examples/train.py --config examples/llama_tiny.toml \
        --parallel.cp 2     # mesh (dp=2, cp=2): the sequence split over cp
    torchrun --nproc_per_node 4 examples/train.py --config examples/llama_tiny.toml \
        --parallel.pp 2     # mesh (pp=2, dp=2): a pipeline of 2 stages (schedule chosen)
                            # (--parallel.pp 0: the pipeline's mesh chosen too)

The model (autoshard.models.Llama) is built on the meta device, planned by AutoParallel
under the configured preset on a CPU (gloo) or CUDA (nccl) mesh, then materialised and
initialised from one seeded full model. Every metrics.log_freq steps it logs loss, tokens/s,
an MFU estimate and peak memory (rank 0; CUDA: max allocated, CPU: the process's peak RSS);
between log points nothing waits for the device (batches go up through pinned memory
without blocking, the loss is read at log points only); every
checkpoint.interval steps the model, optimizer and step go to a
torch.distributed.checkpoint (DCP) folder, and a new run resumes from the newest complete
one. Settings: train_config.py.
"""

from __future__ import annotations

import logging
import math
import os
import re
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from train_config import CP_DIM, PP_DIM, ConfigError, load_config, mesh_layout

log = logging.getLogger("train")


# ---- data ---------------------------------------------------------------------------------
class Batches:
    """The GLOBAL batch of step ``n`` (tokens, next-token labels), the same on every rank and
    a function of (seed, n) only, so a resumed run sees the batches it would have seen.
    Synthetic tokens, or random windows of a text file's bytes."""

    def __init__(self, cfg: dict):
        t, self.vocab = cfg["training"], cfg["model"]["vocab_size"]
        self.batch, self.seq, self.seed = t["batch_size"], t["seq_len"], t["seed"]
        self.text = None
        if cfg["data"]["path"]:
            with open(cfg["data"]["path"], "rb") as f:
                self.text = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
            if self.vocab < 256:
                raise ConfigError(
                    "data.path: bytes are tokens 0..255, so model.vocab_size "
                    f"must be >= 256, got {self.vocab}"
                )
            if len(self.text) < self.seq + 2:
                raise ConfigError(
                    f"data.path: {cfg['data']['path']} has {len(self.text)} "
                    f"bytes, fewer than training.seq_len + 2"
                )

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        if self.text is None:
            seqs = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=g)
        else:
            starts = torch.randint(0, len(self.text) - self.seq - 1, (self.batch,), generator=g)
            seqs = torch.stack([self.text[s : s + self.seq + 1] for s in starts.tolist()])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


# ---- model and plan -------------------------------------------------------------------------
def llama_config(cfg: dict):
    from autoshard.models import LlamaConfig

    m = cfg["model"]
    return LlamaConfig(
        dim=m["dim"],
        n_layers=m["n_layers"],
        n_heads=m["n_heads"],
        n_kv_heads=m["n_kv_heads"],
        vocab_size=m["vocab_size"],
        ffn_dim=m["ffn_dim"],
        max_seq_len=cfg["training"]["seq_len"],
    )


def build_pipeline(cfg: dict, mesh, device: torch.device):
    """The pipeline on mesh (pp, dp), or on the (pp, dp) the planner chooses for
    ``mesh="auto"``: stages planned by autoshard, the schedule and microbatches chosen by
    pricing unless configured (docs/pipeline.md)."""
    from autoshard.models import Llama
    from autoshard.pipeline import plan_pipeline
    from autoshard.planning.planner import default_hardware

    t, p = cfg["training"], cfg["parallel"]
    llama_cfg = llama_config(cfg)
    with torch.device("meta"):
        meta_model = Llama(llama_cfg)
    sample = tuple(torch.empty(t["batch_size"], t["seq_len"], dtype=torch.long) for _ in "xy")
    given = {"hardware": p["hardware"]} if p["hardware"] else {}
    pipe = plan_pipeline(
        meta_model,
        mesh,
        sample,
        pp_dim=PP_DIM,
        schedule=None if p["pp_schedule"] == "auto" else p["pp_schedule"],
        n_microbatches=p["pp_microbatches"] or None,
        time_limit_s=p["plan_time_limit"],
        device_type=device.type if mesh == "auto" else None,
        **given,
    )
    hardware = p["hardware"] or default_hardware(pipe.mesh)
    if pipe.choice is not None:
        log.info("pipeline: %s", pipe.choice.report(5))
    pipe.to_empty(device=device)
    torch.manual_seed(t["seed"])  # every rank builds the same full model, keeps its part
    pipe.load_full_state_dict(Llama(llama_cfg).state_dict())
    n_params = sum(p.numel() for p in meta_model.parameters())
    return pipe, n_params, hardware


def build(cfg: dict, mesh, device: torch.device):
    from autoshard import AutoParallel, load_full_state_dict
    from autoshard.models import Llama
    from autoshard.planning.plan import Plan

    t, p = cfg["training"], cfg["parallel"]
    llama_cfg = llama_config(cfg)
    with torch.device("meta"):
        meta_model = Llama(llama_cfg)
    shape = (t["batch_size"], t["seq_len"])

    def input_fn():
        return torch.empty(shape, dtype=torch.long), torch.empty(shape, dtype=torch.long)

    kwargs = {"hardware": p["hardware"]} if p["hardware"] else {}
    if CP_DIM in (mesh.mesh_dim_names or ()):
        # the sequence split over cp: head-tail order (balanced causal work), or contiguous
        kwargs["cp_load_balance"] = p["cp_load_balance"]
    # AutoParallel logs its stages (trace, plan, solver result; a bar on rank 0's terminal)
    with AutoParallel(
        meta_model,
        input_fn,
        mesh,
        preset=p["preset"] or None,
        time_limit_s=p["plan_time_limit"],
        **kwargs,
    ) as autop:
        placement = autop.optimize_placement()
        model = autop.apply_placement()
    summary = Plan.from_json(placement.plan).summary
    log.info("planned %s; %s", summary.memory.describe(), summary.recompute.describe())
    model.to_empty(device=device)
    torch.manual_seed(t["seed"])  # every rank builds the same full model, keeps its shards
    load_full_state_dict(model, Llama(llama_cfg).state_dict())
    n_params = sum(p.numel() for p in meta_model.parameters())
    return model, n_params, autop.hardware


def flops_per_token(cfg: dict, n_params: int) -> float:
    """Training FLOPs per token: 6 per parameter (forward 2, backward 4) plus attention's
    score and value matmuls, 12 * layers * dim * seq (the usual transformer estimate)."""
    m = cfg["model"]
    return 6.0 * n_params + 12.0 * m["n_layers"] * m["dim"] * cfg["training"]["seq_len"]


def peak_flops(cfg: dict, hardware) -> float:
    if cfg["metrics"]["peak_flops"] > 0:
        return cfg["metrics"]["peak_flops"]
    from autoshard import _core

    name = hardware if isinstance(hardware, str) else "CPU"
    return float(_core.hardware_profile(name)["peak_flops_fp32"])


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on ``device``. CUDA: through page-locked memory and without waiting, so
    the copy is a DMA queued behind the step's kernels instead of a synchronous copy out
    of pageable memory every step (the host would wait for it)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class PipelineLoss:
    """A pipeline step's microbatch losses, held by the last stage's ranks only."""

    def __init__(self, losses: list, device: torch.device):
        self.losses, self.device = losses, device

    def mean(self) -> float:
        """The step's mean loss, on every rank (a collective: every rank calls it)."""
        total = torch.zeros(2, device=self.device)
        for loss in self.losses:
            total[0] += loss.detach().float()
            total[1] += 1
        dist.all_reduce(total)
        return float(total[0] / total[1])


def loss_scalar(loss) -> float:
    """The step's loss as a Python float: a device-to-host copy that waits for the step, so
    it is read at log points only."""
    if isinstance(loss, PipelineLoss):
        return loss.mean()
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    return float(loss.detach())


def model_forward_backward(model):
    """One step's forward and backward through a planned module; returns the loss."""

    def run(*inputs):
        loss = model(*inputs)
        loss.backward()
        return loss

    return run


def pipeline_forward_backward(pipe, device: torch.device):
    """One step through the pipeline's schedule (forward and backward of every microbatch);
    returns its losses."""

    def run(tokens, labels):
        losses: list = []
        pipe.step(tokens, target=labels, losses=losses)
        return PipelineLoss(losses, device)

    return run


def train_steps(
    forward_backward,
    optimizer,
    step_inputs,
    device,
    step: int,
    last: int,
    log_freq: int,
    on_log,
    on_step_end=None,
) -> int:
    """Steps ``step + 1 .. last``; ``step_inputs(n)`` gives step n's arguments of
    ``forward_backward`` (which returns the loss: model_forward_backward,
    pipeline_forward_backward).
    Nothing waits for the device between log points: the loss is read (and the clock read
    after the device is idle) every ``log_freq`` steps and after the last, then
    ``on_log(step, loss, steps_per_second)``; ``on_step_end(step)`` after every step
    (checkpoints). Returns the last step."""
    window_start, window_steps = time.perf_counter(), 0
    while step < last:
        step += 1
        loss = forward_backward(*step_inputs(step))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window_steps += 1
        if step % log_freq == 0 or step == last:
            loss_value = loss_scalar(loss)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the optimizer's kernels too, for the clock
            now = time.perf_counter()
            on_log(step, loss_value, window_steps / max(now - window_start, 1e-9))
            window_start, window_steps = time.perf_counter(), 0
        if on_step_end is not None:
            on_step_end(step)
    return step


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# ---- checkpoints ----------------------------------------------------------------------------
def latest_checkpoint(folder: str) -> tuple[int, str] | None:
    """The newest complete DCP checkpoint folder/step-N (DCP writes .metadata last)."""
    if not os.path.isdir(folder):
        return None
    steps = [
        int(m.group(1))
        for d in os.listdir(folder)
        if (m := re.fullmatch(r"step-(\d+)", d))
        and os.path.exists(os.path.join(folder, d, ".metadata"))
    ]
    return (max(steps), os.path.join(folder, f"step-{max(steps)}")) if steps else None


# the optimizer's state and hyperparameters keyed by parameter name, not by group index: a
# pipeline's ranks each hold other parameters in their group 0, which DCP would otherwise
# save once as if it were one replicated value
OPTIMIZER_STATE = StateDictOptions(flatten_optimizer_state_dict=True)


def train_state(model, optimizer, step: int) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=OPTIMIZER_STATE),
        "train": {"step": torch.tensor(step)},
    }


def save_checkpoint(folder: str, model, optimizer, step: int) -> str:
    path = os.path.join(folder, f"step-{step}")
    dcp.save(train_state(model, optimizer, step), checkpoint_id=path)
    return path


def load_checkpoint(path: str, model, optimizer) -> int:
    state = train_state(model, optimizer, 0)
    dcp.load(state, checkpoint_id=path)  # in place: the model's DTensors take their shards
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=OPTIMIZER_STATE)
    return int(state["train"]["step"])


# ---- the loop --------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    cfg = load_config(argv)
    use_cuda = torch.cuda.is_available()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if use_cuda
        else torch.device("cpu")
    )
    if use_cuda:
        torch.cuda.set_device(device)  # before NCCL starts: its communicators use it
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(message)s",
        stream=sys.stdout,
    )
    if not use_cuda:
        torch.set_num_threads(1)  # ranks share the machine's cores
    p, t, c = cfg["parallel"], cfg["training"], cfg["checkpoint"]
    shape, names = mesh_layout(p, world)
    if shape is None:  # parallel.pp = 0: the planner chooses the pipeline's (pp, dp)
        mesh = "auto"
    elif math.prod(shape) != world:
        raise ConfigError(
            f"parallel.mesh {list(shape)} has {math.prod(shape)} ranks, "
            f"torchrun started {world}"
        )
    else:
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    log.info("config: %s", cfg)

    pipelined = PP_DIM in (names or ())
    if pipelined:
        pipe, n_params, hardware = build_pipeline(cfg, mesh, device)
        mesh, shape = pipe.mesh, tuple(pipe.mesh.shape)
        model = pipe.as_module()  # the stages' tensors under the model's names
        forward_backward = pipeline_forward_backward(pipe, device)
    else:
        model, n_params, hardware = build(cfg, mesh, device)
        forward_backward = model_forward_backward(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=t["weight_decay"])
    batches = Batches(cfg)
    step = 0
    found = latest_checkpoint(c["folder"]) if c["resume"] and c["interval"] > 0 else None
    if found:
        step = load_checkpoint(found[1], model, optimizer)
        log.info("checkpoint: resumed from step %d (%s)", step, found[1])
    tokens_per_step = t["batch_size"] * t["seq_len"]
    flops = flops_per_token(cfg, n_params)
    peak = peak_flops(cfg, hardware) * world
    log.info(
        "model: %.2f M parameters; %d tokens per step; preset %s on mesh %s %s",
        n_params / 1e6,
        tokens_per_step,
        "pipeline" if pipelined else p["preset"],
        list(shape),
        list(names or ()),
    )
    from autoshard import local_inputs

    def step_inputs(n: int):
        tokens, labels = (to_device(x, device) for x in batches(n))
        if pipelined:  # this rank's data-parallel part of the batch
            dp_rank, dp = mesh.get_local_rank("dp"), mesh.size(1)
            return tokens.tensor_split(dp)[dp_rank], labels.tensor_split(dp)[dp_rank]
        return local_inputs(model, tokens, labels)[0]

    def on_log(n: int, loss_value: float, steps_per_s: float) -> None:
        tps = tokens_per_step * steps_per_s
        log.info(
            "step: %4d  loss: %8.4f  tokens/s: %9.0f  mfu: %6.2f%%  " "memory: %8.1f MiB",
            n,
            loss_value,
            tps,
            100.0 * tps * flops / peak,
            peak_memory_mib(device),
        )

    def on_step_end(n: int) -> None:
        if c["interval"] > 0 and (n % c["interval"] == 0 or n == t["steps"]):
            path = save_checkpoint(c["folder"], model, optimizer, n)
            log.info("checkpoint: saved step %d to %s", n, path)

    train_steps(
        forward_backward,
        optimizer,
        step_inputs,
        device,
        step,
        t["steps"],
        cfg["metrics"]["log_freq"],
        on_log,
        on_step_end,
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ConfigError as e:
        print(f"train.py: {e}", file=sys.stderr)
        sys.exit(2)
