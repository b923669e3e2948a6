"""The parallel module's runtime: everything it runs its plan with, in one object.

``build_parallel_module`` makes one ``ModuleRuntime`` and keeps it on the module it returns
(``runtime_of(module)`` reads it); nothing else of autoshard's is stored on the user's
module. It holds what does not change after building (the options, the plan, the traced
order of the state, the input binder) apart from what running changes: each ``Step`` the
module has run (the training step it was built with, and those of other modes and input
sizes, modes.py) with its lowered program, made on first use and dropped when the state
moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from autoshard.program.interpreter import StepRunner
from autoshard.program.execution import ProgramRunState, compile_program
from autoshard.program.local_program import LocalProgram
from autoshard.program.lowering import lower_step
from autoshard.program.passes.overlap import DEFAULT_PREFETCH_BYTES
from autoshard.runtime.inputs import example_local_inputs
from autoshard.runtime.options import RuntimeOptions
from autoshard.trace.input_binding import InputBinder

# the attribute of the parallel module that holds its ModuleRuntime
RUNTIME_ATTR = "_autoshard"


@dataclass
class Step:
    """One planned step the module runs, with its program (lowered on first use)."""

    runner: StepRunner
    program: LocalProgram | None = None
    run_state: ProgramRunState = field(default_factory=ProgramRunState)  # the program's
    # forward output index -> (placements, global shape, stride) of the outputs returned
    # as DTensors (parallel_module.dtensor_output_layouts); None until first needed
    dtensor_outputs: dict | None = None


@dataclass
class ModuleRuntime:
    options: RuntimeOptions
    plan: dict  # the plan JSON the module runs (attention kernels matched to this host)
    main: Step  # the step the module was planned for
    param_order: list[str]  # parameter FQNs in the traced step's order
    buffer_order: list[str]
    param_layouts: dict[str, list[str]]  # parameter FQN -> its at-rest layout
    binder: InputBinder  # a call's (args, kwargs) -> the traced flat inputs, by name
    modes: tuple  # every submodule's training flag when the main step was traced
    source_model: nn.Module  # the user's model (meta), traced again for other modes
    # (step, pins, output_pins) -> plan for other modes' steps; None: placeholders pinned only
    variant_planner: Callable | None = None
    # (modes, joint[, local input shapes]) -> the Step of that mode or input size
    variants: dict[tuple, Step] = field(default_factory=dict)
    # the parallel module's submodules (named_modules order), listed on its first call: their
    # training flags are read every call, and walking the module tree each time cost about
    # 0.15 ms a call on a small pipeline stage
    submodules: list[nn.Module] | None = None
    # a program lowered from the meta state, only to be read (parallel_gm before to_empty)
    meta_program: LocalProgram | None = None
    # set by to_empty: each tensor's versions then; the first call warns about any still
    # unwritten (module_state.py)
    unwritten: dict | None = None

    @property
    def runner(self) -> StepRunner:
        return self.main.runner

    @property
    def program(self) -> LocalProgram | None:
        """The main step's program, once lowered."""
        return self.main.program

    def steps(self) -> list[Step]:
        return [self.main, *self.variants.values()]


def runtime_of(module: nn.Module) -> ModuleRuntime:
    """The runtime of a module built by autoshard (``apply_placement``, ``auto_parallel``)."""
    rt = module.__dict__.get(RUNTIME_ATTR)
    if rt is None:
        raise TypeError(
            f"autoshard: {type(module).__name__} is not a module built by autoshard "
            "(AutoParallel.apply_placement or auto_parallel return one)"
        )
    return rt


def traced_params(module: nn.Module, rt: ModuleRuntime) -> list[DTensor]:
    """The parameters (DTensors) in the traced order."""
    params = dict(module.named_parameters(remove_duplicate=False))
    return [params[f] for f in rt.param_order]


def traced_buffers(module: nn.Module, rt: ModuleRuntime) -> list[DTensor]:
    buffers = dict(module.named_buffers(remove_duplicate=False))
    return [buffers[f] for f in rt.buffer_order]


def state_params(module: nn.Module, rt: ModuleRuntime) -> list[DTensor]:
    """The parameters (DTensors) in the traced order, materialised."""
    out = traced_params(module, rt)
    for fqn, p in zip(rt.param_order, out):
        if p.device.type == "meta":
            raise RuntimeError(
                f"parameter {fqn} is still on the meta device: call "
                "module.to_empty(device=...) and initialise or load the "
                "weights before running the module"
            )
    return out


def param_locals(module: nn.Module, rt: ModuleRuntime) -> list[torch.Tensor]:
    """The parameters' local shards, differentiable (gradients reach the DTensor ``.grad``)."""
    return [p.to_local() for p in state_params(module, rt)]


def buffer_locals(module: nn.Module, rt: ModuleRuntime) -> list[torch.Tensor]:
    return [b.to_local() for b in traced_buffers(module, rt)]


def _state_key(params: list, buffers: list) -> tuple:
    """What a lowered program depends on in the module's state: local shapes, dtypes and
    devices (a `.to(torch.bfloat16)` after lowering needs a new program)."""
    return tuple((tuple(t.shape), t.dtype, t.device) for t in (*params, *buffers))


def lower_program(
    module: nn.Module, rt: ModuleRuntime, runner: StepRunner, flat_inputs: list | None = None
) -> LocalProgram:
    """``runner``'s step lowered to this rank's program (compiled if the options say so)."""
    if flat_inputs is None:
        flat_inputs = example_local_inputs(runner)
    params, buffers = param_locals(module, rt), buffer_locals(module, rt)
    with torch.inference_mode(False), torch.enable_grad():
        program = lower_step(
            runner,
            params,
            buffers,
            flat_inputs,
            prefetch_bytes=prefetch_budget(rt),
            bucket_bytes=rt.options.bucket_bytes,
            reduce_inplace=not rt.options.compile,
            dynamic=rt.options.dynamic,
        )
    if rt.options.compile:
        program = compile_program(program)
    program.state_key = _state_key(params, buffers)
    return program


def prefetch_budget(rt: ModuleRuntime) -> int | None:
    """Bytes of gathered parameters the program may prefetch ahead of their use
    (overlap.py): the user's setting, else what the plan leaves free under the memory limit
    it was fitted to (the planner's peak counts each gathered weight only while its
    consumer runs), at most overlap.py's default; None (the default) for plans without
    a memory summary."""
    if rt.options.prefetch_bytes is not None:
        return rt.options.prefetch_bytes
    summary = (rt.plan or {}).get("summary") or {}
    limit = (summary.get("recompute") or {}).get("limit_bytes") or 0
    peak = (summary.get("memory") or {}).get("peak_bytes")
    if limit <= 0 or peak is None:
        return None
    return max(0, min(DEFAULT_PREFETCH_BYTES, limit - peak))


def step_program(
    module: nn.Module, rt: ModuleRuntime, step: Step, flat_inputs: list | None = None
) -> LocalProgram:
    """``step``'s program, lowered on first use (local shapes come from the materialised
    parameters and the plan's input layouts; no data is read)."""
    if step.program is None:
        step.program = lower_program(module, rt, step.runner, flat_inputs)
        step.run_state = ProgramRunState()
    return step.program


def _state_on_meta(module: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in (*module.parameters(), *module.buffers()))


def inspect_program(module: nn.Module, rt: ModuleRuntime) -> LocalProgram:
    """The program to read graphs from: the module's own once its state is materialised;
    before (meta state), one lowered from the meta shards and meta example inputs, kept
    apart (never run) and dropped when the state is materialised."""
    if not _state_on_meta(module):
        rt.meta_program = None
        return step_program(module, rt, rt.main)
    if rt.meta_program is None:
        runner = rt.runner
        inputs = [
            t.to("meta") if isinstance(t, torch.Tensor) else t for t in example_local_inputs(runner)
        ]
        rt.meta_program = lower_step(
            runner,
            [p._local_tensor for p in traced_params(module, rt)],
            [b._local_tensor for b in traced_buffers(module, rt)],
            inputs,
            prefetch_bytes=prefetch_budget(rt),
            bucket_bytes=rt.options.bucket_bytes,
            dynamic=rt.options.dynamic,
        )
    return rt.meta_program


def refresh_programs(module: nn.Module, rt: ModuleRuntime) -> None:
    """After the state moved or changed dtype: drop the programs lowered for the old state,
    and lower the main step's now when the state is materialised."""
    if not rt.options.runs_program:
        return
    if _state_on_meta(module):
        rt.main.program = None
        return
    key = _state_key(param_locals(module, rt), buffer_locals(module, rt))
    for step in rt.steps():  # other modes' programs are lowered again on first use
        if step.program is not None and step.program.state_key != key:
            step.program = None
    step_program(module, rt, rt.main)
