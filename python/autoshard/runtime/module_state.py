"""The parallel module's state and inputs as the user handles them outside a step: full
(global) weights loaded into the sharded parameters (``load_full_state_dict``, and torch's
``load_state_dict`` through a pre-hook), global inputs cut to this rank's shards
(``local_inputs``), and a warning when a step would read memory ``to_empty`` left unwritten.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor

from autoshard.program.interpreter import StepRunner
from autoshard.runtime.local_shard import local_shard, shard_as_dtensor
from autoshard.runtime.module_runtime import ModuleRuntime, runtime_of


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
    rt = runtime_of(module)
    runner: StepRunner = rt.runner
    flat = rt.binder.flatten(args, kwargs)
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


def distribute_full_tensors(module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
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


def mark_uninitialised(module: nn.Module) -> None:
    runtime_of(module).unwritten = _state_versions(module)


def warn_if_uninitialised(module: nn.Module, rt: ModuleRuntime) -> None:
    """Once, at the first step after to_empty: tensors nobody has written since hold
    whatever memory to_empty got (garbage, NaN), and training on them gives no error."""
    recorded = rt.unwritten
    if recorded is None or torch.compiler.is_compiling():  # checked at the next eager call
        return
    rt.unwritten = None
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
