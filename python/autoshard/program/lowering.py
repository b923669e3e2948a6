"""Lowering a plan to a per-rank program: two FX graphs on LOCAL shards.

The reference interpreter (interpreter.StepRunner) interprets the joint graph node by node as
DTensor ops. Here that interpreter is traced ONCE with ``make_fx`` under a fake tensor mode:
DTensor's dispatch turns every op into its local ATen op (size arguments localised, uneven
shards padded and unpadded) and every redistribution into explicit functional collectives
(``_c10d_functional.all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_reduce`` /
``all_to_all_single``, each followed by ``wait_tensor``). What is recorded is plain ATen on
plain tensors, so running it needs no DTensor dispatch and no per-node interpreter, and
inductor can compile it.

Two graphs, split where the runner splits (nodes that read a tangent are backward):
  forward : (param locals, buffer locals, tensor inputs) -> (outputs, saved tensors)
  backward: (saved tensors, output gradients)            -> (param grads, input grads)
Saved tensors cross as local tensors; the DTensor metadata they need to be re-wrapped in the
backward trace (placements, global shape and stride) is recorded here and only used while
tracing (capture.py). After tracing, the pass pipeline (pipeline.py) rewrites both graphs:
among others overlap.schedule_collectives moves every collective to where its input is ready
and every wait to just before the first use of its result.

Each collective node carries ``meta["custom"]["autoshard_node"]``: the joint-graph node whose
input redistribution issued it, or "<graph outputs>" for the loss and the gradients leaving
in their parameters' layouts (tests compare these with the plan's redistributions).
"""

from __future__ import annotations

from typing import Any

import torch

from autoshard.program.capture import capture_step
from autoshard.program.interpreter import StepRunner
from autoshard.program.local_program import LocalProgram, check_program_devices
from autoshard.program.pipeline import build_program


def lower_step(
    runner: StepRunner,
    param_locals: list[torch.Tensor],
    buffer_locals: list[torch.Tensor],
    input_values: list[Any],
    *,
    prefetch_bytes: int | None = None,
    bucket_bytes: int | None = None,
    reduce_inplace: bool = True,
    dynamic: bool = False,
) -> LocalProgram:
    """``runner``'s step captured (capture.py) and put through the pass pipeline
    (pipeline.py). The example tensors give local shapes and dtypes only (they are replaced
    by fake tensors; nothing runs). ``reduce_inplace`` (eager): fresh buffers are
    all-reduced in place and common ops called through their Python bindings; off when
    inductor compiles the program (it wants functional ATen graphs and re-places them
    itself)."""
    captured = capture_step(runner, param_locals, buffer_locals, input_values, dynamic)
    program = build_program(
        captured,
        runner,
        prefetch_bytes=prefetch_bytes,
        bucket_bytes=bucket_bytes,
        eager=reduce_inplace,
    )
    flat = [*param_locals, *buffer_locals, *input_values]
    if all(flat[i].device == runner.device for i in captured.input_tensor_positions):
        # a program for the materialised state (not one lowered from meta shards to be
        # inspected): it must name this rank's device only
        check_program_devices(program, runner.device)
    return program
