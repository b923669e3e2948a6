"""From a plan to a runnable module.

``build_parallel_module`` returns an ``nn.Module`` of the user's class (``isinstance`` holds)
whose parameters are DTensor ``nn.Parameter``s on the meta device with the plan's at-rest
layouts, registered under the ORIGINAL names (submodules are recreated, so ``state_dict``
keys match the user's model). Materialise with ``to_empty(device=...)``, then initialise or
``load_full_state_dict`` (or torch's ``load_state_dict`` with full tensors: each is sliced
into its parameter's layout). ``forward`` takes this rank's LOCAL inputs, bound to the traced
inputs by argument name (input_binding.py), and returns the local outputs (the loss); ``backward``
leaves DTensor gradients in each parameter's layout. In eval mode or without autograd the
module runs a step planned for that mode (modes.py).

Everything the module runs with is one ``ModuleRuntime`` (module_runtime.py) kept on it;
how the step runs is its ``RuntimeOptions`` (options.py), the ``runtime`` keyword choosing
the executor (executors.py):
- "program" (default): the plan lowered to this rank's forward and backward graphs on local
  shards with explicit, overlapped collectives (program/), lowered when the state is
  materialised; ``compile=True`` compiles them with inductor. The lowered graphs are
  ``module.parallel_gm`` (forward) and ``module.parallel_bwd_gm``.
- "interpret": the reference interpreter (program/interpreter.py: DTensor ops node by
  node), kept for debugging and as the ground truth the program is tested against.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from autoshard.ops.attention_kernels import match_attention_kernels
from autoshard.placements import layout_to_strs
from autoshard.program.interpreter import StepRunner, contiguous_stride
from autoshard.program.local_program import joint_graph
from autoshard.runtime.clean_exit import guard_process_exit
from autoshard.runtime.executors import executor_for
from autoshard.runtime.inputs import check_inputs, dynamic_input_shapes
from autoshard.runtime.modes import module_modes, step_for_current_mode
from autoshard.runtime.module_runtime import (
    RUNTIME_ATTR,
    ModuleRuntime,
    Step,
    buffer_locals,
    inspect_program,
    refresh_programs,
    runtime_of,
)
from autoshard.runtime.module_state import (
    distribute_full_tensors,
    mark_uninitialised,
    warn_if_uninitialised,
)
from autoshard.runtime.options import RuntimeOptions
from autoshard.trace.input_binding import InputBinder
from autoshard.trace.traced_step import TracedStep

_MODULE_INTERNALS = {
    "_parameters",
    "_buffers",
    "_modules",
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_non_persistent_buffers_set",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_is_full_backward_hook",
    "training",
}


def _shell_like(mod: nn.Module, cls: type | None = None) -> nn.Module:
    """An empty module of ``mod``'s class (its __init__ is not run) with its plain
    attributes (configs, sizes) copied; parameters, buffers and children are added later."""
    cls = cls or type(mod)
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    for k, v in mod.__dict__.items():
        if k not in _MODULE_INTERNALS:
            new.__dict__[k] = v
    new.training = mod.training
    return new


def _meta_dtensor(shape, dtype, layout, mesh: DeviceMesh) -> DTensor:
    from autoshard.placements import local_shape

    coords = mesh.get_coordinate() or [0] * mesh.ndim
    local = torch.empty(local_shape(shape, layout, mesh.shape, coords), dtype=dtype, device="meta")
    return DTensor.from_local(
        local,
        mesh,
        layout,
        run_check=False,
        shape=torch.Size(shape),
        stride=contiguous_stride(shape),
    )


def build_parallel_module(
    model: nn.Module,
    step: TracedStep,
    plan: dict,
    mesh: DeviceMesh,
    *,
    strict: bool = False,
    runtime: str = "program",
    compile: bool = False,
    prefetch_bytes: int | None = None,
    bucket_bytes: int | None = None,
    variant_planner=None,
    capture: str = "direct",
    mp_policy: Any = None,
    free_outputs: Any = (),
    dynamic: bool = False,
) -> nn.Module:
    """``variant_planner(step, pins, output_pins) -> plan`` plans the steps of other modes
    (eval, no-grad; modes.py) with the given node layouts pinned; None pins the graph inputs
    only and lets DTensor choose the rest. ``capture`` / ``mp_policy``: how those steps are
    traced (as the training step was). ``free_outputs``: forward output indices whose
    layout the planner chose (no output constraint); the module returns each as a DTensor
    in that layout when the layout shards it (a replicated one, such as a loss, stays a
    plain tensor holding the full value). ``dynamic``: calls whose input sizes differ from
    the traced ones get a step of their own per input shape (modes.py) instead of an
    error."""
    options = RuntimeOptions(
        executor=runtime,
        compile=compile,
        prefetch_bytes=prefetch_bytes,
        bucket_bytes=bucket_bytes,
        strict=strict,
        capture=capture,
        mp_policy=mp_policy,
        dynamic=bool(dynamic),
    )
    # a plan made on another host may name another attention kernel than this trace's
    plan = match_attention_kernels(plan, step.gm)
    runner = StepRunner(step, plan, mesh, strict=strict)
    guard_process_exit()  # gloo: the process ends only once gloo's workers are done
    placeholder_of_fqn = {fqn: ph for ph, fqn in step.param_fqns.items()}
    buffer_ph_of_fqn = {fqn: ph for ph, fqn in step.buffer_fqns.items()}

    def forward(self, *args, **kwargs):
        return _parallel_forward(self, args, kwargs)

    def to_empty(self, *, device, recurse: bool = True):
        nn.Module.to_empty(self, device=device, recurse=recurse)
        mark_uninitialised(self)
        return self

    def parallel_gm(self):
        """This rank's lowered forward graph; before ``to_empty`` (state on the meta
        device), lowered from the meta state (shapes only), as AutoParallel's
        ``autop.parallel_gm`` is readable right after apply_placement."""
        program = inspect_program(self, runtime_of(self))
        return _with_user_annotations(program.fwd_gm, runner.step)

    def parallel_bwd_gm(self):
        program = inspect_program(self, runtime_of(self))
        return _with_user_annotations(program.bwd_gm, runner.step)

    def _apply(self, fn, recurse=True):
        # to_empty / to / cuda: the state's local shapes, dtypes or device may change, so the
        # program follows. Lowering here, outside any forward, is what lets
        # torch.compile(module) trace a first call (make_fx cannot run under Dynamo).
        out = super(par_cls, self)._apply(fn, recurse)
        rt = self.__dict__.get(RUNTIME_ATTR)  # None: _apply while the module is being built
        if rt is not None:
            refresh_programs(self, rt)
        return out

    root_cls = type(model)
    members = {
        "forward": forward,
        "to_empty": to_empty,
        "parallel_gm": property(parallel_gm),
        "parallel_bwd_gm": property(parallel_bwd_gm),
        "_apply": _apply,
    }
    if callable(getattr(root_cls, "init_weights", None)):
        from autoshard.runtime.init_weights import wrap_init_weights

        # single-device init code (assigning or copying full tensors) on DTensor parameters
        members["init_weights"] = wrap_init_weights(root_cls.init_weights)
    par_cls = type(f"AutoShard{root_cls.__name__}", (root_cls,), members)
    shells: dict[str, nn.Module] = {}
    shell_of: dict[int, nn.Module] = {}  # one shell per module object: aliases stay aliases
    for path, mod in model.named_modules(remove_duplicate=False):
        if path in shells:
            continue
        if id(mod) not in shell_of:
            shell_of[id(mod)] = _shell_like(mod, par_cls if path == "" else None)
        shells[path] = shell_of[id(mod)]
    for path, mod in model.named_modules(remove_duplicate=False):
        for name, child in mod._modules.items():
            child_path = f"{path}.{name}" if path else name
            shells[path]._modules[name] = shells[child_path] if child is not None else None
    root = shells[""]

    def at_rest_layout(placeholder):
        # tensors the graph never reads have no placeholder: they stay replicated
        return (
            runner.placeholder_layout(placeholder)
            if placeholder is not None
            else (Replicate(),) * mesh.ndim
        )

    # parameters: one DTensor Parameter per distinct tensor, registered under every alias
    made: dict[int, nn.Parameter] = {}
    param_layouts: dict[str, list[str]] = {}
    for path, mod in model.named_modules(remove_duplicate=False):
        for name, p in mod._parameters.items():
            fqn = f"{path}.{name}" if path else name
            if p is None:
                shells[path]._parameters[name] = None
                continue
            if id(p) not in made:
                layout = at_rest_layout(placeholder_of_fqn.get(fqn))
                made[id(p)] = nn.Parameter(
                    _meta_dtensor(tuple(p.shape), p.dtype, layout, mesh),
                    requires_grad=p.requires_grad,
                )
            shells[path]._parameters[name] = made[id(p)]
            param_layouts[fqn] = layout_to_strs(made[id(p)].placements)
        for name, b in mod._buffers.items():
            fqn = f"{path}.{name}" if path else name
            if b is None:
                shells[path]._buffers[name] = None
                continue
            if id(b) not in made:
                layout = at_rest_layout(buffer_ph_of_fqn.get(fqn))
                made[id(b)] = _meta_dtensor(tuple(b.shape), b.dtype, layout, mesh)
            shells[path]._buffers[name] = made[id(b)]
            if name in mod._non_persistent_buffers_set:
                shells[path]._non_persistent_buffers_set.add(name)

    binder = InputBinder(step.forward_signature, step.input_spec, len(step.input_metas))
    # made now, not at the first call: a compiled call that made them would leave guards
    # on their absence, and the next call would compile again
    binder.labels()
    main = Step(runner, dtensor_outputs=dtensor_output_layouts(runner, free_outputs))
    root.__dict__[RUNTIME_ATTR] = ModuleRuntime(
        options=options,
        plan=plan,
        main=main,
        param_order=[step.param_fqns[n] for n in runner.param_names],
        buffer_order=[step.buffer_fqns[n] for n in runner.buffer_names],
        param_layouts=param_layouts,
        binder=binder,
        modes=module_modes(model),
        source_model=model,
        variant_planner=variant_planner,
    )
    # on every submodule, so that submodule.load_state_dict(full tensors) works as well
    for shell in {id(m): m for m in shells.values()}.values():
        shell.register_load_state_dict_pre_hook(distribute_full_tensors)
    return root


def dtensor_output_layouts(runner: StepRunner, free_outputs) -> dict[int, tuple]:
    """Output index -> (placements, global shape, stride) for the free outputs the plan
    shards: those are returned as DTensors (a local shard alone would be easy to mistake
    for the whole tensor)."""
    out = {}
    for o in runner.fwd_outputs:
        if o.output_index not in free_outputs:
            continue
        layout = runner.plan_graph_output(o)
        val = o.node.meta.get("val") if isinstance(o.node, torch.fx.Node) else None
        if layout is None or not isinstance(val, torch.Tensor):
            continue
        if all(p.is_replicate() for p in layout):
            continue
        out[o.output_index] = (tuple(layout), tuple(val.shape), contiguous_stride(val.shape))
    return out


def _as_dtensors(rt: ModuleRuntime, step: Step, outs: list) -> list:
    if not rt.main.dtensor_outputs:
        return outs
    if step.dtensor_outputs is None:  # another mode's or input size's step: the same
        # outputs, maybe other global shapes
        step.dtensor_outputs = dtensor_output_layouts(step.runner, rt.main.dtensor_outputs)
    outs = list(outs)
    for i, (placements, shape, stride) in step.dtensor_outputs.items():
        if isinstance(outs[i], torch.Tensor) and not isinstance(outs[i], DTensor):
            outs[i] = DTensor.from_local(
                outs[i],
                rt.runner.mesh,
                placements,
                run_check=False,
                shape=torch.Size(shape),
                stride=stride,
            )
    return outs


def _parallel_forward(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    rt = runtime_of(module)
    flat = rt.binder.flatten(args, kwargs)
    shapes = None
    if rt.options.dynamic:  # other input sizes than traced: a step of their own
        shapes = dynamic_input_shapes(rt.runner, flat, rt.binder.labels())
    else:
        check_inputs(rt.runner, flat, rt.binder.labels())
    buffers = buffer_locals(module, rt)
    warn_if_uninitialised(module, rt)
    step, joint = step_for_current_mode(module, rt, flat, shapes)
    executor = executor_for(rt)
    if joint:
        outs = executor.joint(module, rt, step, buffers, flat)
    else:  # eval / no_grad / inference_mode: the forward alone, no autograd graph
        outs = executor.forward_only(module, rt, step, buffers, flat)
    traced = step.runner.step
    if len(outs) == traced.num_forward_outputs:
        outs = _as_dtensors(rt, step, outs)
    if traced.num_forward_outputs == 1:
        return outs[0]
    if traced.output_spec is not None:
        try:
            return pytree.tree_unflatten(list(outs), traced.output_spec)
        except Exception:
            pass
    return tuple(outs)


def parallel_joint_gm(module: nn.Module) -> torch.fx.GraphModule:
    """The module's step as one forward + backward graph (program.joint_graph), with the
    user's annotations: what ``AutoParallel.parallel_gm`` returns, as AutoParallel's."""
    rt = runtime_of(module)
    program = inspect_program(module, rt)
    step = rt.runner.step
    _with_user_annotations(program.fwd_gm, step)
    _with_user_annotations(program.bwd_gm, step)
    return joint_graph(program)


def _with_user_annotations(gm: torch.fx.GraphModule, step: TracedStep):
    """Copies the user's ``fx.traceback.annotate`` metadata (``meta["custom"]``) of each
    traced node onto the lowered nodes computed from it (``custom["autoshard_node"]``
    names it); inserted collectives keep only autoshard's key."""
    user = {n.name: n.meta.get("custom") for n in step.gm.graph.nodes}
    for n in gm.graph.nodes:
        custom = n.meta.get("custom")
        if isinstance(custom, dict) and "autoshard_node" in custom:
            extra = user.get(custom["autoshard_node"])
            if extra:
                n.meta["custom"] = {**extra, **custom}
    return gm
