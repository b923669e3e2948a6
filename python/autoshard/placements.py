"""Placement strings of docs/formats.md (``R``, ``S(d)``, ``P(sum)``...) <-> the placement
objects of ``torch.distributed.tensor``, and local-shape arithmetic."""

from __future__ import annotations

import re
from typing import Sequence

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

_SHARD = re.compile(r"^S\((\d+)\)$")
_PARTIAL = re.compile(r"^P\((sum|avg|max|min)\)$")


def placement_from_str(text: str) -> Placement:
    """``"R"`` -> Replicate(), ``"S(1)"`` -> Shard(1), ``"P(sum)"`` -> Partial("sum")."""
    if text == "R":
        return Replicate()
    m = _SHARD.match(text)
    if m:
        return Shard(int(m.group(1)))
    m = _PARTIAL.match(text)
    if m:
        return Partial(m.group(1))
    raise ValueError(f"unknown placement {text!r}: expected R, S(<dim>) or P(sum|avg|max|min)")


def placement_to_str(p: Placement) -> str:
    """The inverse of placement_from_str; negative Shard dims must be normalised first."""
    if isinstance(p, Shard) and type(p) is Shard:
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        op = getattr(p, "reduce_op", "sum")
        return f"P({op})"
    if p.is_partial():  # other Partial flavours (e.g. the norm partial) reduce like their op
        return f"P({getattr(p, 'reduce_op', 'sum')})"
    raise ValueError(f"placement {p!r} has no autoshard string form (only R, S(d), P(op))")


def layout_from_strs(layout: Sequence[str], mesh_ndim: int, what: str = "layout") -> tuple:
    if layout is None or len(layout) != mesh_ndim:
        raise ValueError(
            f"{what}: expected {mesh_ndim} placements (one per mesh dim), " f"got {layout!r}"
        )
    return tuple(placement_from_str(s) for s in layout)


def layout_to_strs(placements: Sequence[Placement]) -> list[str]:
    return [placement_to_str(p) for p in placements]


def normalize_placements(placements: Sequence[Placement], ndim: int) -> tuple:
    """Shard(-1) -> Shard(ndim - 1), so placements compare equal to the plan's strings."""
    out = []
    for p in placements:
        if isinstance(p, Shard) and type(p) is Shard and p.dim < 0:
            p = Shard(p.dim + ndim)
        out.append(p)
    return tuple(out)


def local_shape(
    global_shape: Sequence[int],
    placements: Sequence[Placement],
    mesh_shape: Sequence[int],
    coords: Sequence[int],
) -> list[int]:
    """The shape of this rank's shard: torch.chunk semantics along each sharded dim, mesh
    dims applied left to right (a dim sharded twice is split again inside its first chunk)."""
    shape = list(global_shape)
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim if p.dim >= 0 else p.dim + len(shape)
            n = mesh_shape[mesh_dim]
            size = shape[d]
            chunk = -(-size // n) if size > 0 else 0
            start = min(chunk * coords[mesh_dim], size)
            shape[d] = max(0, min(size, start + chunk) - start)
    return shape


def is_replicated(layout: Sequence[str]) -> bool:
    return all(s == "R" for s in layout)
