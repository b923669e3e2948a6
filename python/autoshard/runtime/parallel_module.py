"""From a plan to a runnable module.

``build_parallel_module`` returns an ``nn.Module`` of the user's class (``isinstance`` holds)
whose parameters are DTensor ``nn.Parameter``s on the meta device with the plan's at-rest
layouts, registered under the ORIGINAL names (submodules are recreated, so ``state_dict``
keys match the user's model). Materialise with ``to_empty(device=...)``, then initialise or
``load_full_state_dict`` (or torch's ``load_state_dict`` with full tensors: each is sliced
into its parameter's layout). ``forward`` takes this rank's LOCAL inputs, bound to the traced
inputs by argument name (binding.py), and returns the local outputs (the loss); ``backward``
leaves DTensor gradients in each parameter's layout. In eval mode or without autograd the
module runs a step planned for that mode (modes.py).

How the step runs (``runtime``):
- "program" (default): at the first call the plan is lowered to this rank's forward and
  backward graphs on local shards with explicit, overlapped collectives (program.py,
  overlap.py) and those run; ``compile=True`` compiles them with inductor. The lowered
  graphs are ``module.parallel_gm`` (forward) and ``module.parallel_bwd_gm``.
- "interpret": the reference interpreter (runtime.StepRunner: DTensor ops node by node),
  kept for debugging and as the ground truth the program is tested against.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from autoshard.ops.attention_kernels import match_attention_kernels
from autoshard.trace.input_binding import InputBinder
from autoshard.runtime.local_shard import local_shard, shard_as_dtensor
from autoshard.placements import layout_to_strs
from autoshard.program.rng_check import check_random_states_once
from autoshard.program.interpreter import StepRunner, _StepFunction, contiguous_stride
from autoshard.trace.traced_step import TracedStep

RUNTIMES = ("program", "interpret")

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
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if compile and runtime != "program":
        raise ValueError("compile=True compiles the lowered program: use runtime='program'")
    # a plan made on another host may name another attention kernel than this trace's
    plan = match_attention_kernels(plan, step.gm)
    runner = StepRunner(step, plan, mesh, strict=strict)
    placeholder_of_fqn = {fqn: ph for ph, fqn in step.param_fqns.items()}
    buffer_ph_of_fqn = {fqn: ph for ph, fqn in step.buffer_fqns.items()}

    def forward(self, *args, **kwargs):
        return _parallel_forward(self, args, kwargs)

    def to_empty(self, *, device, recurse: bool = True):
        nn.Module.to_empty(self, device=device, recurse=recurse)
        _mark_uninitialised(self)
        return self

    def parallel_gm(self):
        """This rank's lowered forward graph; before ``to_empty`` (state on the meta
        device), lowered from the meta state (shapes only), as AutoParallel's
        ``autop.parallel_gm`` is readable right after apply_placement."""
        return _with_user_annotations(_inspect_program(self).fwd_gm, runner.step)

    def parallel_bwd_gm(self):
        return _with_user_annotations(_inspect_program(self).bwd_gm, runner.step)

    def _apply(self, fn, recurse=True):
        # to_empty / to / cuda: the state's local shapes, dtypes or device may change, so the
        # program follows. Lowering here, outside any forward, is what lets
        # torch.compile(module) trace a first call (make_fx cannot run under Dynamo).
        out = super(par_cls, self)._apply(fn, recurse)
        _refresh_program(self)
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

    root._autoshard_runner = runner
    root._autoshard_runtime = runtime
    root._autoshard_compile = compile
    root._autoshard_prefetch_bytes = prefetch_bytes  # overlap.py: None = its defaults
    root._autoshard_bucket_bytes = bucket_bytes
    root._autoshard_program = None
    root._autoshard_plan = plan
    root._autoshard_param_order = [step.param_fqns[n] for n in runner.param_names]
    root._autoshard_buffer_order = [step.buffer_fqns[n] for n in runner.buffer_names]
    root._autoshard_param_layouts = param_layouts
    root._autoshard_binder = InputBinder(
        step.forward_signature, step.input_spec, len(step.input_metas)
    )
    # made now, not at the first call: a compiled call that made them would leave guards
    # on their absence, and the next call would compile again
    root._autoshard_binder.labels()
    root._autoshard_unwritten = None  # set by to_empty: tensor versions not yet written
    root._autoshard_modes = module_modes(model)  # the modes the step was traced in
    root._autoshard_variants = {}  # other modes' steps (modes.py), built on first use
    root._autoshard_variant_planner = variant_planner  # None: placeholders pinned only
    # traced again for other modes; kept out of _modules (not a submodule of the result)
    root.__dict__["_autoshard_source_model"] = model
    root._autoshard_capture = capture
    root._autoshard_mp_policy = mp_policy
    root._autoshard_dtensor_outputs = _dtensor_output_layouts(runner, free_outputs)
    root._autoshard_dynamic = bool(dynamic)
    # on every submodule, so that submodule.load_state_dict(full tensors) works as well
    for shell in {id(m): m for m in shells.values()}.values():
        shell.register_load_state_dict_pre_hook(_distribute_full_tensors)
    return root


def _dtensor_output_layouts(runner: StepRunner, free_outputs) -> dict[int, tuple]:
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


def _as_dtensors(module: nn.Module, outs: list, runner: StepRunner | None = None) -> list:
    layouts = module._autoshard_dtensor_outputs
    if not layouts:
        return outs
    if runner is not None and runner is not module._autoshard_runner:
        # a step of other input sizes (dynamic=True): the same outputs, other global shapes
        layouts = runner.__dict__.get("_autoshard_dtensor_outputs")
        if layouts is None:
            layouts = _dtensor_output_layouts(runner, module._autoshard_dtensor_outputs)
            runner.__dict__["_autoshard_dtensor_outputs"] = layouts
    mesh = module._autoshard_runner.mesh
    outs = list(outs)
    for i, (placements, shape, stride) in layouts.items():
        if isinstance(outs[i], torch.Tensor) and not isinstance(outs[i], DTensor):
            outs[i] = DTensor.from_local(
                outs[i], mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride
            )
    return outs


def module_modes(module: nn.Module) -> tuple:
    """Every submodule's ``training`` flag (named_modules order): what decides dropout and
    batch statistics, so what a traced step depends on."""
    return tuple(m.training for _, m in module.named_modules())


def _parallel_forward(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    from autoshard.runtime.modes import step_for_current_mode

    binder: InputBinder = module._autoshard_binder
    flat = binder.flatten(args, kwargs)
    shapes = None
    if module._autoshard_dynamic:  # other input sizes than traced: a step of their own
        shapes = dynamic_input_shapes(module._autoshard_runner, flat, binder.labels())
    else:
        check_inputs(module._autoshard_runner, flat, binder.labels())
    buffer_locals = _buffer_locals(module)
    _warn_if_uninitialised(module)
    runner, get_program, joint = step_for_current_mode(module, flat, shapes)
    step = runner.step
    if not joint:  # eval / no_grad / inference_mode: the forward alone, no autograd graph
        with torch.no_grad():
            if module._autoshard_runtime == "interpret":
                outs = runner.run_forward(_param_locals(module), buffer_locals, flat)[0]
            else:
                program = get_program()
                check_random_states_once(program, runner)
                params = [p._local_tensor for p in _state_params(module)]
                tensors = [
                    v for v in (*params, *buffer_locals, *flat) if isinstance(v, torch.Tensor)
                ]
                local_outs = program.fwd(*tensors)[: program.n_outputs]
                outs = [
                    local_outs[s] if not isinstance(s, tuple) else s[1]
                    for s in program.output_slots
                ]
    elif module._autoshard_runtime == "interpret":
        param_locals = _param_locals(module)
        outs = _StepFunction.apply(
            runner, len(param_locals), len(buffer_locals), *param_locals, *buffer_locals, *flat
        )
    else:
        from autoshard.program.lowering import ProgramFunction

        program = get_program()
        check_random_states_once(program, runner)
        # Eager: the parameters go in as DTensors; ProgramFunction unwraps them and wraps
        # their gradients itself, cheaper than an autograd to_local / from_local pair per
        # parameter. Under torch.compile (Dynamo cannot pass DTensor specs through an
        # autograd.Function), their local shards.
        if torch.compiler.is_compiling():
            params, n_dtensors = _param_locals(module), 0
        else:
            params = _state_params(module)
            n_dtensors = len(params)
        tensors = [v for v in (*params, *buffer_locals, *flat) if isinstance(v, torch.Tensor)]
        local_outs = ProgramFunction.apply(program, n_dtensors, *tensors)
        outs = [local_outs[s] if not isinstance(s, tuple) else s[1] for s in program.output_slots]
    if len(outs) == step.num_forward_outputs:
        outs = _as_dtensors(module, outs, runner)
    if step.num_forward_outputs == 1:
        return outs[0]
    if step.output_spec is not None:
        try:
            return pytree.tree_unflatten(list(outs), step.output_spec)
        except Exception:
            pass
    return tuple(outs)


def _traced_params(module: nn.Module) -> list[DTensor]:
    """The parameters (DTensors) in the traced order."""
    params = dict(module.named_parameters(remove_duplicate=False))
    return [params[f] for f in module._autoshard_param_order]


def _traced_buffers(module: nn.Module) -> list[DTensor]:
    buffers = dict(module.named_buffers(remove_duplicate=False))
    return [buffers[f] for f in module._autoshard_buffer_order]


def _state_params(module: nn.Module) -> list[DTensor]:
    """The parameters (DTensors) in the traced order, materialised."""
    out = _traced_params(module)
    for fqn, p in zip(module._autoshard_param_order, out):
        if p.device.type == "meta":
            raise RuntimeError(
                f"parameter {fqn} is still on the meta device: call "
                "module.to_empty(device=...) and initialise or load the "
                "weights before running the module"
            )
    return out


def _param_locals(module: nn.Module) -> list[torch.Tensor]:
    """The parameters' local shards, differentiable (gradients reach the DTensor ``.grad``)."""
    return [p.to_local() for p in _state_params(module)]


def _buffer_locals(module: nn.Module) -> list[torch.Tensor]:
    return [b.to_local() for b in _traced_buffers(module)]


def _state_locals(module: nn.Module) -> tuple[list, list]:
    """The local shards of the parameters and buffers, in the traced order."""
    return _param_locals(module), _buffer_locals(module)


def _program(module: nn.Module, flat_inputs: list | None = None):
    """The lowered program of this rank, built on first use (local shapes come from the
    materialised parameters and the plan's input layouts; no data is read)."""
    if module._autoshard_program is None:
        module._autoshard_program = lower_program(module, module._autoshard_runner, flat_inputs)
    return module._autoshard_program


def _inspect_program(module: nn.Module):
    """The program to read graphs from: the module's own once its state is materialised;
    before (meta state), one lowered from the meta shards and meta example inputs, kept
    apart (never run) and dropped when the state is materialised."""
    states = [*module.parameters(), *module.buffers()]
    if not any(t.device.type == "meta" for t in states):
        module.__dict__.pop("_autoshard_meta_program", None)
        return _program(module)
    prog = module.__dict__.get("_autoshard_meta_program")
    if prog is None:
        from autoshard.program.lowering import lower_step

        runner = module._autoshard_runner
        param_locals = [p._local_tensor for p in _traced_params(module)]
        buffer_locals = [b._local_tensor for b in _traced_buffers(module)]
        inputs = [
            t.to("meta") if isinstance(t, torch.Tensor) else t
            for t in _example_local_inputs(runner)
        ]
        prog = lower_step(
            runner,
            param_locals,
            buffer_locals,
            inputs,
            prefetch_bytes=module._autoshard_prefetch_bytes,
            bucket_bytes=module._autoshard_bucket_bytes,
            dynamic=module._autoshard_dynamic,
        )
        module.__dict__["_autoshard_meta_program"] = prog
    return prog


def parallel_joint_gm(module: nn.Module) -> torch.fx.GraphModule:
    """The module's step as one forward + backward graph (program.joint_graph), with the
    user's annotations: what ``AutoParallel.parallel_gm`` returns, as AutoParallel's."""
    from autoshard.program.lowering import joint_graph

    program = _inspect_program(module)
    step = module._autoshard_runner.step
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


def lower_program(module: nn.Module, runner: StepRunner, flat_inputs: list | None = None):
    """``runner``'s step lowered to this rank's program (compiled if the module is)."""
    from autoshard.program.lowering import compile_program, lower_step

    if flat_inputs is None:
        flat_inputs = _example_local_inputs(runner)
    param_locals, buffer_locals = _state_locals(module)
    program = lower_step(
        runner,
        param_locals,
        buffer_locals,
        flat_inputs,
        prefetch_bytes=module._autoshard_prefetch_bytes,
        bucket_bytes=module._autoshard_bucket_bytes,
        reduce_inplace=not module._autoshard_compile,
        dynamic=module._autoshard_dynamic,
    )
    if module._autoshard_compile:
        program = compile_program(program)
    program.state_key = _state_key(param_locals, buffer_locals)
    return program


def _state_key(param_locals: list, buffer_locals: list) -> tuple:
    """What a lowered program depends on in the module's state: local shapes, dtypes and
    devices (a `.to(torch.bfloat16)` after lowering needs a new program)."""
    return tuple((tuple(t.shape), t.dtype, t.device) for t in (*param_locals, *buffer_locals))


def _refresh_program(module: nn.Module) -> None:
    """After the state moved or changed dtype: drop a program lowered for the old state, and
    lower now when the state is materialised (no parameter left on the meta device)."""
    if getattr(module, "_autoshard_runtime", None) != "program":
        return  # _apply also runs while the module is being built
    states = [*module.parameters(), *module.buffers()]
    if any(t.device.type == "meta" for t in states):
        module._autoshard_program = None
        return
    key = _state_key(*_state_locals(module))
    if module._autoshard_program is not None and module._autoshard_program.state_key != key:
        module._autoshard_program = None
    for variant in getattr(module, "_autoshard_variants", {}).values():
        if variant.program is not None and variant.program.state_key != key:
            variant.program = None  # other modes' programs are lowered again on first use
    _program(module)


def _example_local_inputs(runner: StepRunner) -> list:
    out = []
    for meta, name in zip(runner.step.input_metas, runner.step.input_nodes):
        if _is_traced_tensor(meta):
            shape = runner.expected_local_shape(name) if name is not None else meta[0]
            out.append(torch.empty(shape, dtype=meta[1], device=runner.device))
        else:
            out.append(meta)
    return out


def _is_traced_tensor(meta) -> bool:
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
        raise ValueError(
            f"autoshard: expected {len(step.input_metas)} inputs (flattened args "
            f"then kwargs) as traced, got {len(flat)}"
        )
    for i, (v, meta, name) in enumerate(zip(flat, step.input_metas, step.input_nodes)):
        i = f"{i} ({labels[i]})" if labels else i
        if _is_traced_tensor(meta):
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


def load_full_state_dict(module: nn.Module, full_state: dict[str, torch.Tensor]) -> None:
    """Copy full (global) tensors into the module's DTensor parameters and buffers: each
    rank keeps its own shard (no communication; every rank must pass the same values)."""
    own = dict(module.named_parameters(remove_duplicate=False))
    own.update(dict(module.named_buffers(remove_duplicate=False)))
    missing = sorted(set(own) - set(full_state))
    unexpected = sorted(set(full_state) - set(own))
    if missing or unexpected:
        raise KeyError(f"load_full_state_dict: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, t in own.items():
            full = full_state[name]
            if tuple(full.shape) != tuple(t.shape):
                raise ValueError(
                    f"load_full_state_dict: {name} has shape {tuple(full.shape)}, "
                    f"the module expects {tuple(t.shape)}"
                )
            if isinstance(t, DTensor):
                local = t.to_local()
                # sliced where `full` lives: only this rank's shard reaches the device
                shard = local_shard(
                    full, t.device_mesh, t.placements, device=local.device, dtype=local.dtype
                )
                local.copy_(shard)
            else:
                t.copy_(full)


def local_inputs(module: nn.Module, *args, **kwargs):
    """This rank's shards of GLOBAL inputs, in the layouts the module's plan expects (no
    communication: every rank slices its own part). Returns (args, kwargs)."""
    runner: StepRunner = module._autoshard_runner
    flat = module._autoshard_binder.flatten(args, kwargs)
    out = []
    for v, name in zip(flat, runner.step.input_nodes):
        if isinstance(v, torch.Tensor) and name is not None:
            layout = runner.placeholder_layout(name)
            # as distribute_tensor places it (on the mesh's device type), but only the
            # shard is copied there
            on_mesh_device = v.device.type in (runner.mesh.device_type, "meta")
            device = v.device if on_mesh_device else runner.device
            v = local_shard(v, runner.mesh, layout, device=device)
        out.append(v)
    a, k = pytree.tree_unflatten(out, runner.step.input_spec)  # in the traced spelling
    return a, k


def _distribute_full_tensors(module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
    """load_state_dict pre-hook: a full (global) tensor for a DTensor parameter or buffer
    becomes this rank's shard of it (sliced locally, as load_full_state_dict does), so
    torch's own load_state_dict works with ordinary checkpoints; DTensors in another layout
    are redistributed. Shapes that differ are left for torch to report."""
    own = dict(module.named_parameters(remove_duplicate=False))
    own.update(module.named_buffers(remove_duplicate=False))
    for name, t in own.items():
        key = prefix + name
        v = state_dict.get(key)
        if (
            not isinstance(t, DTensor)
            or not isinstance(v, torch.Tensor)
            or tuple(v.shape) != tuple(t.shape)
        ):
            continue
        if isinstance(v, DTensor):
            if tuple(v.placements) != tuple(t.placements) and v.device_mesh == t.device_mesh:
                state_dict[key] = v.redistribute(t.device_mesh, t.placements)
            continue
        # the checkpoint's dtype is kept (torch's copy_ converts); only the shard moves
        state_dict[key] = shard_as_dtensor(
            v, t.device_mesh, t.placements, device=t._local_tensor.device
        )


def _state_versions(module: nn.Module) -> dict[str, tuple]:
    """Version counters per parameter and buffer: every in-place write (initialisers,
    copy_, load_state_dict, optimizer steps) bumps the DTensor's own counter, and writes to
    its local shard (load_full_state_dict) bump the shard's."""
    out = {}
    for name, t in (
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ):
        local = t._local_tensor if isinstance(t, DTensor) else t
        out[name] = (t, local, t._version, local._version)
    return out


def _mark_uninitialised(module: nn.Module) -> None:
    module._autoshard_unwritten = _state_versions(module)


def _warn_if_uninitialised(module: nn.Module) -> None:
    """Once, at the first step after to_empty: tensors nobody has written since hold
    whatever memory to_empty got (garbage, NaN), and training on them gives no error."""
    recorded = module._autoshard_unwritten
    if recorded is None or torch.compiler.is_compiling():  # checked at the next eager call
        return
    module._autoshard_unwritten = None
    now = _state_versions(module)
    stale = [
        name
        for name, (t, local, v, lv) in recorded.items()
        if name in now and now[name][0] is t and now[name][1] is local and now[name][2:] == (v, lv)
    ]
    if stale:
        import warnings

        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        warnings.warn(
            f"autoshard: {shown} were materialised by to_empty() and never written since: "
            "they hold uninitialised memory. Initialise them (e.g. call each module's "
            "reset_parameters() or your init function) or load weights (load_state_dict / "
            "autoshard.load_full_state_dict) before running the module",
            stacklevel=3,
        )
