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
from typing import Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor, Replicate

from autoshard.ops.local_map_collectives import planning_on
from autoshard.placements import layout_to_strs
from autoshard.program.interpreter import StepRunner
from autoshard.runtime.inputs import is_traced_tensor
from autoshard.runtime.module_runtime import ModuleRuntime, Step, step_program
from autoshard.trace.traced_step import ForwardInputs, TracedStep
from autoshard.trace.tracer import trace_training_step

log = logging.getLogger("autoshard")


def module_modes(module: nn.Module, rt: ModuleRuntime | None = None) -> tuple:
    """Every submodule's ``training`` flag (named_modules order): what decides dropout and
    batch statistics, so what a traced step depends on. With ``rt``, the submodules listed
    on the module's first call (a module's tree does not change under its program)."""
    if rt is None:
        return tuple(m.training for _, m in module.named_modules())
    if rt.submodules is None:
        rt.submodules = [m for _, m in module.named_modules()]
    return tuple(m.training for m in rt.submodules)


def step_for_current_mode(
    module: nn.Module, rt: ModuleRuntime, flat_inputs: list, shapes: tuple | None = None
) -> tuple[Step, bool]:
    """(step, joint) for the module's current modes and autograd state; joint=False means
    run the forward alone, without an autograd graph. ``shapes``: the local input shapes
    when they differ from the traced ones (dynamic=True; inputs.dynamic_input_shapes), else
    None. The step's program is lowered by the executor, from ``flat_inputs``."""
    modes = module_modes(module, rt)
    # (Dynamo cannot ask about inference mode, and compiled code never runs under it)
    joint = torch.is_grad_enabled() and (
        torch.compiler.is_compiling() or not torch.is_inference_mode_enabled()
    )
    if joint and modes == rt.modes and shapes is None:
        return rt.main, True
    key = (modes, joint) if shapes is None else (modes, joint, shapes)
    if torch.compiler.is_compiling():
        # Dynamo is tracing the call (torch.compile of the module): the step of this mode is
        # traced, planned and lowered now, by Python, outside the graph Dynamo builds
        # (tracing and planning cannot be captured); the graph then runs its program
        _prepare_variant(module, rt, key)
    step = rt.variants.get(key)
    if step is None:
        with torch.inference_mode(False), torch.enable_grad():
            step = Step(_plan_variant(module, rt, *key))
        rt.variants[key] = step
    return step, joint


@torch._dynamo.assume_constant_result
def _prepare_variant(module: nn.Module, rt: ModuleRuntime, key: tuple) -> bool:
    """The step of ``key`` = (modes, joint[, input shapes]), planned and lowered (from the
    example local inputs) if not yet. Dynamo calls it while tracing, as Python (a result it
    may take as a constant), so torch.compile(module, fullgraph=True) traces a first call in
    a new mode."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    step = rt.variants.get(key)
    # (graph modules made while Dynamo compiles are lazy, and Dynamo refuses to call a lazy
    # one: the program's are made ordinary; Dynamo cannot capture the model again inside
    # its own compilation, so the model is traced directly, without source lines)
    with torch.inference_mode(False), torch.enable_grad(), _use_lazy_graph_module(False):
        if step is None:
            step = Step(_plan_variant(module, rt, *key, capture="direct"))
            rt.variants[key] = step
        if rt.options.runs_program:
            step_program(module, rt, step)
    return True


def _plan_variant(
    module: nn.Module,
    rt: ModuleRuntime,
    modes: tuple,
    joint: bool,
    shapes: tuple | None = None,
    capture: str | None = None,
) -> StepRunner:
    main: StepRunner = rt.runner
    paths = [path for path, _ in module.named_modules()]
    what = ("training" if all(modes) else "eval" if not any(modes) else "mixed-mode") + (
        " step" if joint else " forward (no autograd)"
    )
    global_shapes = None
    if shapes is not None:
        global_shapes = _global_input_shapes(main, shapes)
        what += (
            " with input shapes "
            + ", ".join(str(list(g)) for g in global_shapes if g is not None)
            + " (global)"
        )
        _check_same_shapes_on_every_rank(global_shapes)
    log.info("autoshard: first call as a %s: tracing and planning it", what)
    with planning_on(main.mesh):  # local_map regions without device_mesh= (collectives.py)
        step = trace_training_step(
            rt.source_model,
            _example_inputs(main.step, joint, global_shapes),
            main.step.device,
            capture=capture or rt.options.capture,
            mp_policy=rt.options.mp_policy,
            training=dict(zip(paths, modes)),
            joint=joint,
            load_balance=main.step.load_balance,
        )
    pins = _pinned_layouts(module, main, step)
    out_pins = {}
    if step.num_forward_outputs == main.step.num_forward_outputs:
        for o in main.fwd_outputs:
            layout = main.plan_graph_output(o)
            if layout is not None:  # callers get Partial outputs reduced, so pin that
                out_pins[str(o.output_index)] = layout_to_strs(
                    tuple(Replicate() if p.is_partial() else p for p in layout)
                )
    planner = rt.variant_planner
    plan = planner(step, pins, out_pins) if planner is not None else {"nodes": {}}
    # The runner wraps each local shard in its placeholder's planned layout, so that layout
    # must be the one the tensor has. Enforced even if a planner moved a pin: the runner
    # then redistributes explicitly to each consumer's planned input layout.
    nodes = plan.setdefault("nodes", {})
    for ph, strs in pins.items():
        entry = dict(nodes.get(ph) or {})
        if entry.get("outputs") not in (None, [strs]):
            log.warning(
                "autoshard: the %s plan moved %s to %s; keeping %s and " "redistributing",
                what,
                ph,
                entry["outputs"][0],
                strs,
            )
        entry["outputs"] = [strs]
        nodes[ph] = entry
    runner = StepRunner(step, plan, main.mesh, strict=main.strict, device=main.device)
    if shapes is not None:
        _check_local_shapes(runner, shapes)
    return runner


def _global_input_shapes(main: StepRunner, shapes: tuple) -> list:
    """The global shape of each tensor input whose local shape is given: the local size
    times the mesh dims sharding it in the layout the training step takes it in (even
    shards, as every rank passes a shard of the same size)."""
    out = []
    for local, name in zip(shapes, main.step.input_nodes):
        if local is None or name is None:
            out.append(None)
            continue
        size = list(local)
        for mesh_dim, p in enumerate(main.placeholder_layout(name)):
            if p.is_shard():
                size[p.dim % len(size)] *= int(main.mesh.size(mesh_dim))
        out.append(tuple(size))
    return out


def _check_local_shapes(runner: StepRunner, shapes: tuple) -> None:
    for i, (local, name) in enumerate(zip(shapes, runner.step.input_nodes)):
        if local is None or name is None:
            continue
        want = runner.expected_local_shape(name)
        if list(local) != list(want):
            raise ValueError(
                f"autoshard: input {i} has the local shape {list(local)}, which is not an "
                f"even shard of any global shape in its layout "
                f"{layout_to_strs(runner.placeholder_layout(name))} (this rank would hold "
                f"{want} of the global {list(runner.global_shape(name))}); with dynamic=True "
                "every rank passes a shard of the same size"
            )


def _check_same_shapes_on_every_rank(global_shapes: list) -> None:
    """Every rank plans the new step together (rank 0's plan is broadcast), so every rank
    must be called with the same global input shapes."""
    import torch.distributed as dist

    from autoshard.trace.fake_pg import real_multi_rank_group

    if not real_multi_rank_group():
        return
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, [list(g) if g is not None else None for g in global_shapes])
    if any(s != seen[0] for s in seen):
        ranks = ", ".join(f"rank {r}: {s}" for r, s in enumerate(seen))
        raise ValueError(
            "autoshard: dynamic=True: the ranks were called with inputs of "
            f"different global shapes ({ranks}); every rank must pass its "
            "shard of the same global inputs in the same call"
        )


def _pinned_layouts(module: nn.Module, main: StepRunner, step: TracedStep) -> dict:
    """Placeholder -> layout: parameters and buffers as they are stored, inputs as the
    training step takes them (an input that step never read arrives whole: replicated)."""
    stored = {
        name: layout_to_strs(t.placements)
        for name, t in (
            *module.named_parameters(remove_duplicate=False),
            *module.named_buffers(remove_duplicate=False),
        )
        if isinstance(t, DTensor)
    }
    pins = {}
    for ph, fqn in (*step.param_fqns.items(), *step.buffer_fqns.items()):
        if fqn in stored:
            pins[ph] = stored[fqn]
    for name, main_name in zip(step.input_nodes, main.step.input_nodes):
        if name is not None:
            pins[name] = (
                layout_to_strs(main.placeholder_layout(main_name))
                if main_name is not None
                else ["R"] * main.mesh.ndim
            )
    return pins


def _example_inputs(
    step: TracedStep, joint: bool, global_shapes: list | None = None
) -> Callable[[], ForwardInputs]:
    """The traced step's example inputs again (global shapes; made under the fake mode),
    with the given global shapes where not None."""
    requires_grad = list(step.input_requires_grad) or [False] * len(step.input_metas)

    def make() -> ForwardInputs:
        leaves = []
        shapes = global_shapes or [None] * len(step.input_metas)
        for meta, rg, shape in zip(step.input_metas, requires_grad, shapes):
            if is_traced_tensor(meta):
                t = torch.empty(shape if shape is not None else meta[0], dtype=meta[1])
                leaves.append(t.requires_grad_() if joint and rg else t)
            else:
                leaves.append(meta)
        args, kwargs = pytree.tree_unflatten(leaves, step.input_spec)
        return ForwardInputs(args=tuple(args), kwargs=dict(kwargs))

    return make
