"""A pipeline stage that runs under autoshard's plan: the stage module planned with
AutoParallel on the stage's mesh (the mesh's dims other than the pipeline dim: the
data-parallel ranks that run this stage together) and wrapped as torch's
``PipelineStage``, which sends and receives the activations between stages.

A stage is planned for one microbatch: its inputs are the microbatch's global tensors
(every data-parallel rank's part), batch-sharded over the stage mesh; a non-first stage's
input activation requires grad, so the traced step returns its gradient, which the stage
sends back to the previous stage. Hidden states leave batch-sharded (each rank sends its
part on to the same data-parallel position of the next stage), the last stage's loss
replicated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import Replicate, Shard

from autoshard.api.autoparallel import AutoParallel
from autoshard.pipeline.stage_modules import StageModule


@dataclass(frozen=True)
class MicrobatchShapes:
    """Global shapes (over the stage mesh) of one microbatch's tensors."""

    tokens: tuple[int, ...]
    hidden: tuple[int, ...]
    hidden_dtype: torch.dtype = torch.float32
    token_dtype: torch.dtype = torch.int64


class StageCall(nn.Module):
    """What torch's ``PipelineStage`` runs: the planned stage module, given the labels
    (passed to every stage as a keyword by the schedule) only on the last stage."""

    def __init__(self, parallel: nn.Module, takes_labels: bool):
        super().__init__()
        self.parallel = parallel
        self.takes_labels = takes_labels

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.parallel(x, labels) if self.takes_labels else self.parallel(x)


@dataclass
class PlannedStage:
    """One stage on this rank: where it sits, the module it runs (planned, or the stage as
    written where its plan is the identity: ``runs_as_written``), its plan and torch's
    stage."""

    split: StageModule
    parallel: nn.Module
    call: StageCall
    plan: dict
    as_written: bool = False
    stage: PipelineStage | None = None


def plan_stage(
    split: StageModule,
    mesh: DeviceMesh,
    shapes: MicrobatchShapes,
    planner_kwargs: dict[str, Any],
) -> nn.Module:
    """``split``'s module (on the meta device) planned on ``mesh`` for one microbatch."""
    batch = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)

    def input_fn():
        if split.is_first:
            x = torch.empty(shapes.tokens, dtype=shapes.token_dtype)
        else:  # an activation from the previous stage: its gradient goes back there
            x = torch.empty(shapes.hidden, dtype=shapes.hidden_dtype, requires_grad=True)
        if split.is_last:
            return (x, torch.empty(shapes.tokens, dtype=shapes.token_dtype))
        return (x,)

    n_inputs = 2 if split.is_last else 1
    out = (Replicate(),) * mesh.ndim if split.is_last else batch
    with AutoParallel(split.module, input_fn, mesh, **planner_kwargs) as autop:
        autop.add_input_constraints([batch] * n_inputs)
        autop.add_output_constraints([out])
        plan = autop.optimize_placement()
        return autop.apply_placement(plan)


def runs_as_written(plan: dict, mesh: DeviceMesh, planner_kwargs: dict) -> bool:
    """A stage planned on one rank with nothing recomputed and no mixed-precision casts:
    its plan is the identity (every layout whole, every activation kept), so the fastest
    program for it is the module itself, without the lowered program's per-call work
    (a small stage's call is about 8 % slower through the program on CPU)."""
    if mesh.size() != 1 or planner_kwargs.get("mp_policy") is not None:
        return False
    recompute = (plan.get("summary", {}).get("recompute") or {}).get("blocks") or {}
    return not plan.get("recompute") and not recompute


def wrap_stage(
    planned: PlannedStage, n_stages: int, device: torch.device, pp_group
) -> PipelineStage:
    """torch's stage around the planned module; shapes are inferred on the first step."""
    return PipelineStage(planned.call, planned.split.index, n_stages, device, group=pp_group)
