"""How a step runs: the two executors of a parallel module's steps.

``ProgramExecutor`` runs this rank's lowered program (program/lowering.py: plain ATen graphs
on local shards with explicit collectives; compiled when the options say so).
``InterpretExecutor`` runs the reference interpreter (program/interpreter.py: the joint
graph as DTensor ops, node by node), the ground truth the program is tested against.
Both take the same inputs and return the module's local outputs; ``joint`` runs the step
under autograd (the backward follows from ``loss.backward()``), ``forward_only`` runs the
forward alone (eval, no_grad, inference_mode).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn

from autoshard.program.interpreter import _StepFunction
from autoshard.program.execution import ProgramFunction
from autoshard.program.local_program import LocalProgram
from autoshard.program.rng_check import check_random_states_once
from autoshard.runtime.module_runtime import (
    ModuleRuntime,
    Step,
    param_locals,
    state_params,
    step_program,
)


class Executor(Protocol):
    def joint(
        self, module: nn.Module, rt: ModuleRuntime, step: Step, buffers: list, flat: list
    ) -> list: ...

    def forward_only(
        self, module: nn.Module, rt: ModuleRuntime, step: Step, buffers: list, flat: list
    ) -> list: ...


def _tensors(*groups) -> list[torch.Tensor]:
    return [v for group in groups for v in group if isinstance(v, torch.Tensor)]


def _module_outputs(program: LocalProgram, local_outs) -> list:
    return [local_outs[s] if not isinstance(s, tuple) else s[1] for s in program.output_slots]


class ProgramExecutor:
    def _program(self, module, rt: ModuleRuntime, step: Step, flat: list) -> LocalProgram:
        program = step_program(module, rt, step, flat)
        check_random_states_once(program, step.run_state, step.runner)
        return program

    def joint(self, module, rt, step, buffers, flat) -> list:
        program = self._program(module, rt, step, flat)
        # Eager: the parameters go in as DTensors; ProgramFunction unwraps them and wraps
        # their gradients itself, cheaper than an autograd to_local / from_local pair per
        # parameter. Under torch.compile (Dynamo cannot pass DTensor specs through an
        # autograd.Function), their local shards.
        if torch.compiler.is_compiling():
            params, n_dtensors = param_locals(module, rt), 0
        else:
            params = state_params(module, rt)
            n_dtensors = len(params)
        tensors = _tensors(params, buffers, flat)
        local_outs = ProgramFunction.apply(program, step.run_state, n_dtensors, *tensors)
        return _module_outputs(program, local_outs)

    def forward_only(self, module, rt, step, buffers, flat) -> list:
        program = self._program(module, rt, step, flat)
        params = [p._local_tensor for p in state_params(module, rt)]
        with torch.no_grad():
            local_outs = program.fwd(*_tensors(params, buffers, flat))[: program.n_outputs]
        return _module_outputs(program, local_outs)


class InterpretExecutor:
    def joint(self, module, rt, step, buffers, flat) -> list:
        params = param_locals(module, rt)
        return _StepFunction.apply(step.runner, len(params), len(buffers), *params, *buffers, *flat)

    def forward_only(self, module, rt, step, buffers, flat) -> list:
        with torch.no_grad():
            return step.runner.run_forward(param_locals(module, rt), buffers, flat)[0]


def executor_for(rt: ModuleRuntime) -> Executor:
    return ProgramExecutor() if rt.options.runs_program else InterpretExecutor()
