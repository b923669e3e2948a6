"""The public entry: ``plan_pipeline`` cuts a model into stages, plans each stage this rank
runs with autoshard on the stage's mesh, wraps it as torch's ``PipelineStage`` and drives
the stages with one of torch's schedules; ``Pipeline.step`` mirrors the schedule's
``step``."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from autoshard.pipeline.choice import choose_pipeline, hardware_name
from autoshard.pipeline.search import PipelineSearch, StageProfile
from autoshard.pipeline.stage_modules import split_model
from autoshard.pipeline.stage_runtime import (
    MicrobatchShapes,
    PlannedStage,
    StageCall,
    plan_stage,
    runs_as_written,
    wrap_stage,
)
from autoshard.pipeline.stage_split import balanced_split_points, layer_ranges
from autoshard.runtime.module_runtime import runtime_of
from autoshard.runtime.module_state import load_full_state_dict

# schedule name -> (torch's class, whether it runs several stages per rank)
SCHEDULES = {
    "GPipe": (ScheduleGPipe, False),
    "1F1B": (Schedule1F1B, False),
    "Interleaved1F1B": (ScheduleInterleaved1F1B, True),
}


def _loss_is_output(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The last stage returns the loss itself (planned with the head: stage_modules.py)."""
    return output


@dataclass
class Pipeline:
    """This rank's stages and the schedule that runs them."""

    mesh: DeviceMesh
    pp_dim: str
    n_microbatches: int
    stages: list[PlannedStage]
    schedule: Any = None
    n_stages: int = 0
    stage_layers: list[range] = field(default_factory=list)
    choice: PipelineSearch | None = None  # the candidates priced, when the planner chose
    _module: nn.Module | None = field(default=None, repr=False)  # as_module(), built once

    def step(self, *args, target: torch.Tensor, losses: list | None = None) -> None:
        """One training step on this rank's data-parallel part of the batch: ``args`` the
        first stage's inputs (token ids), ``target`` the labels (given on every rank: the
        last stage's module takes them, passed by the schedule as a keyword). Gradients
        accumulate over the microbatches, divided by their number (torch's
        ``scale_grads``); ``losses`` gets each microbatch's loss on the last stage's
        ranks."""
        self.schedule.step(*args, target=target, losses=losses, return_outputs=False, labels=target)

    def parameters(self) -> Iterator[nn.Parameter]:
        yield from self.as_module().parameters()

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the model's names: DTensors on the stage meshes, plain
        tensors for a one-rank stage that runs as written (stage_runtime.runs_as_written)."""
        yield from self.as_module().named_parameters(remove_duplicate=False)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's parameters and buffers under the model's names, as
        ``torch.distributed.checkpoint`` takes them: ``dcp.save(pipe.state_dict(), ...)``
        writes each tensor once whatever the split, and ``dcp.load(sd, ...)`` with
        ``sd = pipe.state_dict()`` loads a checkpoint of any split (or of the unsplit
        model's names) into this pipeline's tensors in place."""
        return dict(self.as_module().state_dict(keep_vars=True))

    def as_module(self) -> nn.Module:
        """This rank's parameters and buffers as one module under the model's names: what an
        optimizer, ``state_dict`` and torch's optimizer-state helpers
        (``get_optimizer_state_dict(module, optimizer)``) take, so that checkpoints carry
        the model's names whatever the split. The tensors are the stages' own; the module
        is not callable (``step`` runs the pipeline)."""
        if self._module is None:
            self._module = _NamedTensors()
            for s in self.stages:
                for name, p in s.parallel.named_parameters():
                    _holder(self._module, s.split.full_name(name)).register_parameter(
                        name.rsplit(".", 1)[-1], p
                    )
                for name, b in s.parallel.named_buffers():
                    _holder(self._module, s.split.full_name(name)).register_buffer(
                        name.rsplit(".", 1)[-1], b
                    )
        return self._module

    def to_empty(self, device) -> "Pipeline":
        for s in self.stages:
            s.parallel.to_empty(device=device)
        self._module = None  # to_empty made new tensors
        return self

    def load_full_state_dict(self, state_dict: dict) -> None:
        """Load the model's full tensors (its ``state_dict``) into this rank's stages."""
        mine = self.state_dict()
        load_full_state_dict(self.as_module(), {n: state_dict[n] for n in mine})


class _NamedTensors(nn.Module):
    """A container of a pipeline's tensors under the model's names (Pipeline.as_module)."""

    def forward(self, *args, **kwargs):
        raise TypeError("a pipeline's as_module() holds its tensors only; run Pipeline.step")


def _holder(root: nn.Module, full_name: str) -> nn.Module:
    """The submodule of ``root`` that holds the tensor named ``full_name`` (created on the
    way: ``layers.3.attention.wq.weight`` -> root.layers.3.attention.wq)."""
    module = root
    for part in full_name.split(".")[:-1]:
        if part not in module._modules:
            module.add_module(part, _NamedTensors())
        module = module._modules[part]
    return module


def plan_pipeline(
    model: nn.Module,
    mesh: DeviceMesh | str,
    sample_inputs: tuple,
    *,
    pp_dim: str = "pp",
    schedule: str | None = None,
    n_microbatches: int | None = None,
    virtual_stages: int | None = None,
    split_points: list[int] | None = None,
    world_size: int | None = None,
    gpus_per_node: int | None = None,
    device_type: str | None = None,
    stage_profile: StageProfile | None = None,
    **planner_kwargs,
) -> Pipeline:
    """Plan ``model`` (on the meta device) as a pipeline over ``mesh``'s ``pp_dim``.

    ``sample_inputs``: ``(tokens, labels)`` shaped like one step's whole batch (all
    data-parallel ranks' parts; meta tensors will do). The stages are
    ``mesh.size(pp_dim) * virtual_stages`` contiguous ranges of ``model.layers``
    (``split_points``: the first layer of every stage but the first; default: balanced by
    training FLOPs, the output head counted on the last stage: stage_split.py); stage ``s``
    runs on pipeline rank ``s % pp``. Each stage this rank runs is planned by autoshard on
    the mesh's other dim (its data-parallel ranks; a 1-rank mesh where that dim has size 1)
    for one microbatch. ``planner_kwargs`` go to ``AutoParallel`` (``time_limit_s``,
    ``plan_cache``, ``hardware``, ``memory_limit_bytes``, ...). Call ``to_empty`` and
    ``load_full_state_dict`` (or initialise) before ``step``.

    What is left out is chosen (choice.py): ``schedule`` None or "auto",
    ``n_microbatches`` / ``virtual_stages`` None, each candidate priced by the schedule's
    simulation (``_core.price_pipeline``) on the model's stage costs (``stage_profile``,
    default from FLOPs) and the fastest that fits ``memory_limit_bytes`` taken.
    ``mesh="auto"`` also chooses pp x dp for ``world_size`` ranks (default: the process
    group's) with ``gpus_per_node`` per node and builds the mesh (``device_type``: default
    "cuda" where available, else "cpu"; dims ``(pp_dim, "dp")``). The choice and the table
    of candidates priced are ``Pipeline.choice`` (``print(pipe.choice)``); None when the
    user fixed everything."""
    auto_mesh = isinstance(mesh, str)
    if auto_mesh and mesh != "auto":
        raise ValueError(f"pipeline: mesh={mesh!r}; a DeviceMesh or 'auto'")
    if not auto_mesh and (world_size is not None or gpus_per_node is not None):
        raise ValueError(
            "pipeline: world_size and gpus_per_node describe the ranks for mesh='auto'; "
            "with a DeviceMesh the mesh says them"
        )
    if not auto_mesh:
        pp_size, world = _check_mesh(mesh, pp_dim)
        device_type = mesh.device_type
    else:
        import torch.distributed as dist

        pp_size = None
        world = world_size or (dist.get_world_size() if dist.is_initialized() else 0)
        device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    choice = None
    if auto_mesh or AUTO_VALUES.intersection({schedule, n_microbatches, virtual_stages}):
        choice = choose_pipeline(
            model,
            sample_inputs,
            world_size=world,
            gpus_per_node=gpus_per_node,
            pp=pp_size,
            schedule=schedule,
            n_microbatches=n_microbatches,
            virtual_stages=virtual_stages,
            hardware=hardware_name(planner_kwargs.get("hardware"), device_type),
            memory_limit_bytes=planner_kwargs.get("memory_limit_bytes"),
            profile=stage_profile,
        )
        c = choice.chosen.candidate
        schedule, n_microbatches, virtual_stages = c.schedule, c.microbatches, c.virtual
        if split_points is None:  # run the stages that were priced
            split_points = choice.chosen.estimate["split_points"]
        if auto_mesh:
            mesh = _auto_mesh(device_type, c.pp, c.dp, pp_dim)
    choices = (schedule, n_microbatches, virtual_stages)
    pipe = _build(model, mesh, sample_inputs, pp_dim, choices, split_points, planner_kwargs)
    pipe.choice = choice
    return pipe


AUTO_VALUES = {None, "auto"}


def _auto_mesh(device_type: str, pp: int, dp: int, pp_dim: str) -> DeviceMesh:
    """The chosen (pp, dp) mesh over the process group, which must hold exactly its ranks."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 0
    if world != pp * dp:
        raise ValueError(
            f"pipeline: mesh='auto' chose pp={pp} x dp={dp} and builds it on the process "
            f"group, which has {world or 'no'} ranks; run under torchrun with {pp * dp} ranks "
            "(world_size= only differs for the choice on paper: choose_pipeline)"
        )
    return init_device_mesh(device_type, (pp, dp), mesh_dim_names=(pp_dim, "dp"))


def _check_mesh(mesh: DeviceMesh, pp_dim: str) -> tuple[int, int]:
    """(pipeline ranks, all ranks) of a user's mesh of ``pp_dim`` and one other dim."""
    names = mesh.mesh_dim_names or ()
    if pp_dim not in names:
        raise ValueError(f"pipeline: the mesh has no dim {pp_dim!r} (dims: {names})")
    if len(names) != 2:
        raise NotImplementedError(
            f"pipeline: a mesh of {pp_dim!r} and exactly one other dim (data parallel, size 1 "
            f"allowed) is supported for now; got dims {names}"
        )
    return mesh.size(names.index(pp_dim)), mesh.size()


def _build(model, mesh, sample_inputs, pp_dim, choices, split_points, planner_kwargs) -> Pipeline:
    """The pipeline with every choice made (``choices``: schedule, microbatches, stages per
    rank): the stages this rank runs planned and wrapped, and torch's schedule over them."""
    schedule, n_microbatches, virtual_stages = choices
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline: schedule {schedule!r}; one of {sorted(SCHEDULES)}")
    schedule_cls, multi = SCHEDULES[schedule]
    if virtual_stages != 1 and not multi:
        raise ValueError(
            f"pipeline: schedule {schedule!r} runs one stage per rank; virtual_stages="
            f"{virtual_stages} needs Interleaved1F1B"
        )
    names = mesh.mesh_dim_names
    others = [n for n in names if n != pp_dim]
    stage_mesh = mesh[others[0]]
    pp = mesh.size(names.index(pp_dim))
    pp_rank = mesh.get_local_rank(pp_dim)
    n_stages = pp * virtual_stages
    tokens, _labels = sample_inputs
    if split_points is None:
        split_points = balanced_split_points(model, n_stages, tokens.shape[-1])
    ranges = layer_ranges(len(model.layers), n_stages, split_points)
    batch = tokens.shape[0]
    dp = stage_mesh.size()
    if batch % (dp * n_microbatches):
        raise ValueError(
            f"pipeline: a batch of {batch} does not split into {dp} data-parallel parts of "
            f"{n_microbatches} microbatches each"
        )
    mb_tokens = (batch // n_microbatches, *tokens.shape[1:])
    splits = split_model(model, ranges)
    with torch.device("meta"):
        hidden = splits[0].module(torch.zeros(mb_tokens, dtype=tokens.dtype, device="meta"))
    shapes = MicrobatchShapes(
        tokens=tuple(mb_tokens),
        hidden=tuple(hidden.shape),
        hidden_dtype=hidden.dtype,
        token_dtype=tokens.dtype,
    )
    device = torch.device(mesh.device_type)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    pp_group = mesh.get_group(pp_dim)
    planned = []
    for split in splits:
        if split.index % pp != pp_rank:
            continue
        parallel = plan_stage(split, stage_mesh, shapes, planner_kwargs)
        plan = runtime_of(parallel).plan
        as_written = runs_as_written(plan, stage_mesh, planner_kwargs)
        if as_written:
            # a copy: materialising it must not touch the user's (meta) model
            parallel = copy.deepcopy(split.module)
        call = StageCall(parallel, split.is_last)
        planned.append(PlannedStage(split, parallel, call, plan, as_written))
    for p in planned:
        p.stage = wrap_stage(p, n_stages, device, pp_group)
    stages = [p.stage for p in planned]
    sched = schedule_cls(
        stages if multi else stages[0],
        n_microbatches=n_microbatches,
        loss_fn=_loss_is_output,
        scale_grads=True,
    )
    return Pipeline(mesh, pp_dim, n_microbatches, planned, sched, n_stages, ranges)
