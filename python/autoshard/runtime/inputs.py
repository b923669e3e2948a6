"""A call's inputs checked against the traced step: this rank's local shards, in the
layouts and local shapes the plan gives them (or, with dynamic=True, other sizes of the
same number of dims), and example local inputs made from the traced records."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from autoshard.placements import layout_to_strs
from autoshard.program.interpreter import StepRunner
from autoshard.trace.input_binding import InputArgumentsError


def example_local_inputs(runner: StepRunner) -> list:
    out = []
    for meta, name in zip(runner.step.input_metas, runner.step.input_nodes):
        if is_traced_tensor(meta):
            shape = runner.expected_local_shape(name) if name is not None else meta[0]
            out.append(torch.empty(shape, dtype=meta[1], device=runner.device))
        else:
            out.append(meta)
    return out


def is_traced_tensor(meta) -> bool:
    """A traced input's record is (shape, dtype) for a tensor, the value itself otherwise."""
    return isinstance(meta, tuple) and len(meta) == 2 and isinstance(meta[1], torch.dtype)


def dynamic_input_shapes(runner: StepRunner, flat: list, labels: list[str]) -> tuple | None:
    """For a module built with dynamic=True: None when the tensor inputs have the local
    shapes ``runner`` expects, else each input's local shape (None for non-tensors and
    inputs the graph never reads), the key of the step for those sizes. The number of dims,
    dtypes and non-tensor values must still be the traced ones."""
    check_inputs(runner, flat, labels, check_sizes=False)
    shapes, differ = [], False
    for v, name in zip(flat, runner.step.input_nodes):
        if isinstance(v, torch.Tensor) and name is not None:
            shapes.append(tuple(int(s) for s in v.shape))
            differ = differ or list(v.shape) != list(runner.expected_local_shape(name))
        else:
            shapes.append(None)
    return tuple(shapes) if differ else None


def check_inputs(
    runner: StepRunner, flat: list, labels: list[str] | None = None, check_sizes: bool = True
) -> None:
    """Local inputs must match what the plan expects of this rank; errors name the input.
    ``check_sizes=False`` (dynamic=True) checks the number of dims, not the sizes."""
    step = runner.step
    if len(flat) != len(step.input_metas):
        raise InputArgumentsError(
            f"autoshard: expected {len(step.input_metas)} inputs (flattened args "
            f"then kwargs) as traced, got {len(flat)}"
        )
    for i, (v, meta, name) in enumerate(zip(flat, step.input_metas, step.input_nodes)):
        i = f"{i} ({labels[i]})" if labels else i
        if is_traced_tensor(meta):
            if not isinstance(v, torch.Tensor) or isinstance(v, DTensor):
                raise TypeError(
                    f"autoshard: input {i} must be a plain torch.Tensor holding "
                    f"this rank's local shard, got {type(v).__name__}"
                )
            if name is None:
                continue
            want = runner.expected_local_shape(name)
            layout = layout_to_strs(runner.placeholder_layout(name))
            if not check_sizes and v.dim() != len(want):
                raise ValueError(
                    f"autoshard: input {i} has {v.dim()} dims (shape {list(v.shape)}) but was "
                    f"traced with {len(want)} (local shape {want}, layout {layout}); "
                    "dynamic=True lets sizes change, not the number of dims"
                )
            if check_sizes and list(v.shape) != list(want):
                raise ValueError(
                    f"autoshard: input {i} has shape {list(v.shape)} but this rank expects "
                    f"the local shape {want} (global {list(meta[0])}, layout {layout}); pass "
                    "each rank's local shard, not the global tensor (or build the module "
                    "with dynamic=True for inputs whose sizes change between calls)"
                )
            if v.dtype != meta[1]:
                raise ValueError(
                    f"autoshard: input {i} has dtype {v.dtype} but was traced " f"with {meta[1]}"
                )
        elif isinstance(v, torch.Tensor):
            raise TypeError(
                f"autoshard: input {i} was traced as the value {meta!r}, got a " "tensor"
            )
        elif v != meta:
            raise ValueError(
                f"autoshard: input {i} has value {v!r} but was traced with " f"{meta!r}"
            )
