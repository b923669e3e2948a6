"""``with_sharding_constraint(x, placements)``: a placement pin written inside the model.

In the model it is an identity (a copy of ``x``). While tracing it is the custom op
``autoshard::sharding_constraint`` carrying the layout as text, and its backward pins the
gradient of ``x`` to the same layout (AutoParallel pins both directions too). After the
joint graph is exported, ``take_sharding_pins`` turns each such node into a plain
``aten.clone`` and returns its name with the layout, which AutoParallel adds as node
constraints: the planner must produce exactly that layout there. The clone keeps the
constraint in ``meta["local_map_kwargs"]``, the key AutoParallel's local_map-based
constraint nodes carry, so the same graph lookups find it.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.fx as fx
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement

from autoshard.placements import layout_to_strs, normalize_placements, placement_from_str


@torch.library.custom_op("autoshard::sharding_constraint", mutates_args=())
def _sharding_constraint(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.clone()


@_sharding_constraint.register_fake
def _(x: torch.Tensor, layout: str) -> torch.Tensor:
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output) -> None:
    ctx.layout = inputs[1]


def _backward(ctx, grad: torch.Tensor):
    return _sharding_constraint(grad, ctx.layout), None


_sharding_constraint.register_autograd(_backward, setup_context=_setup_context)

_OP = torch.ops.autoshard.sharding_constraint.default


def with_sharding_constraint(
    x: torch.Tensor, shardings: Sequence[Placement], device_mesh=None
) -> torch.Tensor:
    """Pin ``x`` (and its gradient) to ``shardings``, one placement per mesh dim, in the
    planned step. On a DTensor (eager DTensor code) it redistributes to that layout."""
    if isinstance(shardings, Placement):
        shardings = (shardings,)
    shardings = tuple(shardings)
    for p in shardings:
        if not isinstance(p, Placement):
            raise TypeError(
                f"with_sharding_constraint: {p!r} is not a placement (Shard, " "Replicate, Partial)"
            )
    if device_mesh is not None and len(shardings) != device_mesh.ndim:
        raise ValueError(
            f"with_sharding_constraint: {len(shardings)} placements for a "
            f"{device_mesh.ndim}-d mesh"
        )
    if isinstance(x, DTensor):
        return x.redistribute(device_mesh or x.device_mesh, shardings)
    layout = layout_to_strs(normalize_placements(shardings, x.ndim))
    return _sharding_constraint(x, ",".join(layout))


def take_sharding_pins(gm: fx.GraphModule) -> dict[str, tuple[list[str], str]]:
    """Replaces every sharding_constraint node of ``gm`` by an ``aten.clone`` (in place);
    returns {clone node name: (layout, " at <source line>" or "")}."""
    pins: dict[str, tuple[list[str], str]] = {}
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not _OP:
            continue
        with gm.graph.inserting_before(n):
            clone = gm.graph.call_function(torch.ops.aten.clone.default, (n.args[0],))
        clone.meta = dict(n.meta)
        layout = n.args[1].split(",")
        clone.meta["local_map_kwargs"] = _as_local_map_kwargs(layout)
        n.replace_all_uses_with(clone)
        gm.graph.erase_node(n)
        pins[clone.name] = (layout, _user_line(clone.meta.get("stack_trace")))
    if pins:
        gm.graph.lint()
        gm.recompile()
    return pins


def _as_local_map_kwargs(layout: list[str]) -> dict:
    """The constraint described as AutoParallel's graphs describe theirs: AutoParallel's
    with_sharding_constraint is an identity local_map region, whose node carries its
    declaration in ``meta["local_map_kwargs"]`` (and the backward's the partitioner tag
    ``is_backward``, which the clone keeps from the trace). Code that finds AutoParallel's
    constraints by that key finds autoshard's clones. The mesh is that of the AutoParallel
    tracing the model (None outside one)."""
    from autoshard.ops.local_map_collectives import planning_mesh

    placements = tuple(placement_from_str(p) for p in layout)
    return {
        "out_placements": placements,
        "in_placements": (placements,),
        "in_grad_placements": None,
        "device_mesh": planning_mesh(),
        "redistribute_inputs": True,
    }


def _user_line(stack_trace: str | None) -> str:
    """`` at model.py:12: `h = with_sharding_constraint(h, ...)` `` from a node's stack
    trace: the innermost frame outside autoshard."""
    import os
    import re

    from autoshard.user_frames import AUTOSHARD_DIR

    lines = (stack_trace or "").splitlines()
    here = AUTOSHARD_DIR
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "([^"]+)", line (\d+)', lines[i])
        if m and not m.group(1).startswith(here):
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f" at {os.path.basename(m.group(1))}:{m.group(2)}" + (
                f": `{code}`" if code else ""
            )
    return ""
