"""The parallel module in modes other than the one its step was planned for.

The planned step is the forward in the modes the model was traced in (usually training:
dropout on, batch statistics) plus its backward. Called in eval mode, or without autograd
(torch.no_grad / inference_mode), the module must behave as the single-device model does
there, so each combination of submodule modes and autograd gets its own step, built on first
use and cached: the model traced again in those modes (the forward alone when autograd is
off), planned with every parameter, buffer and input pinned to the layout it already has
(no re-layout between modes; outputs keep the training step's layouts too, so callers see
the same local shapes), and lowered like the training step. ``.train()`` with autograd on
selects the original step again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor, Replicate

from .placements import layout_to_strs
from .runtime import StepRunner
from .trace import ForwardInputs, TracedStep, trace_training_step

log = logging.getLogger("autoshard")


@dataclass
class Variant:
    runner: StepRunner
    program: Any = None  # lowered on first use; dropped when the state moves (apply.py)


def step_for_current_mode(module: nn.Module, flat_inputs: list
                          ) -> tuple[StepRunner, Callable[[], Any], bool]:
    """(runner, program getter, joint) for the module's current modes and autograd state;
    joint=False means run the forward alone, without an autograd graph."""
    from .apply import _program, lower_program, module_modes

    modes = module_modes(module)
    # (Dynamo cannot ask about inference mode, and compiled code never runs under it)
    joint = torch.is_grad_enabled() and (torch.compiler.is_compiling()
                                         or not torch.is_inference_mode_enabled())
    if joint and modes == module._autoshard_modes:
        return module._autoshard_runner, lambda: _program(module, flat_inputs), True
    key = (modes, joint)
    variant = module._autoshard_variants.get(key)
    if variant is None:
        with torch.inference_mode(False), torch.enable_grad():
            variant = Variant(_plan_variant(module, modes, joint))
        module._autoshard_variants[key] = variant

    def get_program():
        if variant.program is None:
            with torch.inference_mode(False), torch.enable_grad():
                variant.program = lower_program(module, variant.runner, flat_inputs)
        return variant.program

    return variant.runner, get_program, joint


def _plan_variant(module: nn.Module, modes: tuple, joint: bool) -> StepRunner:
    main: StepRunner = module._autoshard_runner
    paths = [path for path, _ in module.named_modules()]
    what = ("training" if all(modes) else "eval" if not any(modes) else "mixed-mode") + (
        " step" if joint else " forward (no autograd)")
    log.info("autoshard: first call as a %s: tracing and planning it", what)
    step = trace_training_step(module._autoshard_source_model, _example_inputs(main.step, joint),
                               main.step.device, capture=module._autoshard_capture,
                               mp_policy=module._autoshard_mp_policy,
                               training=dict(zip(paths, modes)), joint=joint)
    pins = _pinned_layouts(module, main, step)
    out_pins = {}
    if step.num_forward_outputs == main.step.num_forward_outputs:
        for o in main.fwd_outputs:
            layout = main.plan_graph_output(o)
            if layout is not None:  # callers get Partial outputs reduced, so pin that
                out_pins[str(o.output_index)] = layout_to_strs(
                    tuple(Replicate() if p.is_partial() else p for p in layout))
    planner = module._autoshard_variant_planner
    plan = planner(step, pins, out_pins) if planner is not None else {"nodes": {}}
    # The runner wraps each local shard in its placeholder's planned layout, so that layout
    # must be the one the tensor has. Enforced even if a planner moved a pin: the runner
    # then redistributes explicitly to each consumer's planned input layout.
    nodes = plan.setdefault("nodes", {})
    for ph, strs in pins.items():
        entry = dict(nodes.get(ph) or {})
        if entry.get("outputs") not in (None, [strs]):
            log.warning("autoshard: the %s plan moved %s to %s; keeping %s and "
                        "redistributing", what, ph, entry["outputs"][0], strs)
        entry["outputs"] = [strs]
        nodes[ph] = entry
    return StepRunner(step, plan, main.mesh, strict=main.strict, device=main.device)


def _pinned_layouts(module: nn.Module, main: StepRunner, step: TracedStep) -> dict:
    """Placeholder -> layout: parameters and buffers as they are stored, inputs as the
    training step takes them (an input that step never read arrives whole: replicated)."""
    stored = {name: layout_to_strs(t.placements)
              for name, t in (*module.named_parameters(remove_duplicate=False),
                              *module.named_buffers(remove_duplicate=False))
              if isinstance(t, DTensor)}
    pins = {}
    for ph, fqn in (*step.param_fqns.items(), *step.buffer_fqns.items()):
        if fqn in stored:
            pins[ph] = stored[fqn]
    for name, main_name in zip(step.input_nodes, main.step.input_nodes):
        if name is not None:
            pins[name] = (layout_to_strs(main.placeholder_layout(main_name))
                          if main_name is not None else ["R"] * main.mesh.ndim)
    return pins


def _example_inputs(step: TracedStep, joint: bool) -> Callable[[], ForwardInputs]:
    """The traced step's example inputs again (global shapes; made under the fake mode)."""
    from .apply import _is_traced_tensor

    requires_grad = list(step.input_requires_grad) or [False] * len(step.input_metas)

    def make() -> ForwardInputs:
        leaves = []
        for meta, rg in zip(step.input_metas, requires_grad):
            if _is_traced_tensor(meta):
                t = torch.empty(meta[0], dtype=meta[1])
                leaves.append(t.requires_grad_() if joint and rg else t)
            else:
                leaves.append(meta)
        args, kwargs = pytree.tree_unflatten(leaves, step.input_spec)
        return ForwardInputs(args=tuple(args), kwargs=dict(kwargs))

    return make
