"""Collectives for use inside ``autoshard.local_map`` regions, over one named (or numbered)
dim of the region's mesh, in the style of AutoParallel's ``autoparallel.collectives``:
``axis_size``, ``axis_index``, ``all_gather``, ``reduce_scatter``, ``all_reduce``,
``all_to_all``, plus ``grad_all_reduce`` (identity forward, all-reduced gradient).

Each is torch's functional collective (``_c10d_functional``, then ``wait_tensor``) on the
mesh dim's process group, so it runs for real on gloo/NCCL ranks and traces on fake tensors
under the fake process group (planning a 64-rank mesh in one process: nothing is
communicated, only shapes are propagated).

Gradients (docs/local_map.md, "Gradient semantics"): a region receives the gradient of a
Replicate output as the FULL gradient, the same on every rank, as torch's ``local_map``
does. The backward of each collective is its transpose under that convention:

- ``all_reduce(x)`` (sum): identity; ``"avg"``: divided by the axis size;
- ``all_gather(x, d)``: this rank's chunk of the gradient along ``d`` (no communication);
- ``reduce_scatter(x, d)``: all-gather of the gradient along ``d``;
- ``all_to_all(x, out_splits, in_splits)``: the all-to-all back (splits swapped).

A replicated value that then meets rank-dependent data inside the region (an all_reduce
result multiplied by a weight shard, a Replicate input used with a sharded weight) gets a
per-rank partial gradient that must be summed: wrap it in ``grad_all_reduce(x, axis)``
(Megatron's "f"), or declare that input's ``in_grad_placements`` Partial.

The mesh is the one of the region running (``local_map(..., device_mesh=mesh)``); outside a
region, the mesh of the last ``local_map`` call, as AutoParallel does.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

_c10d = torch.ops._c10d_functional

_RUNNING: list = []  # meshes of the regions running now, innermost last
_LAST_MESH = None  # the device_mesh of the most recent local_map(...) call
_PLANNING: list = []  # meshes of the AutoParallel traces running now, innermost last


@contextlib.contextmanager
def planning_on(mesh):
    """While AutoParallel traces a model for ``mesh``: a ``local_map`` without
    ``device_mesh=`` is declared on it (ops/local_map.py)."""
    _PLANNING.append(mesh)
    try:
        yield
    finally:
        _PLANNING.pop()


def planning_mesh():
    """The mesh of the AutoParallel trace running now, or None."""
    return _PLANNING[-1] if _PLANNING else None


@contextlib.contextmanager
def running_on(mesh):
    """While a region's function runs: its mesh is the one the collectives use."""
    _RUNNING.append(mesh)
    try:
        yield
    finally:
        _RUNNING.pop()


def set_last_mesh(mesh) -> None:
    global _LAST_MESH
    _LAST_MESH = mesh


def current_mesh():
    if _RUNNING:
        return _RUNNING[-1]
    if _LAST_MESH is not None:
        return _LAST_MESH
    raise RuntimeError(
        "autoshard.collectives: no mesh; call the collectives inside a function "
        "wrapped by autoshard.local_map(..., device_mesh=mesh)"
    )


def _mesh_dim(axis, mesh) -> int:
    names = tuple(mesh.mesh_dim_names or ())
    if isinstance(axis, str):
        if axis not in names:
            raise ValueError(
                f"autoshard.collectives: mesh has no dim named {axis!r} "
                f"(its dims: {names or 'unnamed'}; pass a dim index instead)"
            )
        return names.index(axis)
    if isinstance(axis, int) and not isinstance(axis, bool) and -mesh.ndim <= axis < mesh.ndim:
        return axis % mesh.ndim
    raise ValueError(
        f"autoshard.collectives: axis {axis!r} is neither a dim name nor an index "
        f"of the {mesh.ndim}-d mesh"
    )


def _group(axis):
    """(mesh, mesh dim, group size, group name) of ``axis``."""
    mesh = current_mesh()
    dim = _mesh_dim(axis, mesh)
    return mesh, dim, int(mesh.size(dim)), mesh.get_group(dim).group_name


def axis_size(axis) -> int:
    """Number of ranks along mesh dim ``axis`` (a name or an index)."""
    mesh = current_mesh()
    return int(mesh.size(_mesh_dim(axis, mesh)))


def axis_index(axis) -> int:
    """This rank's coordinate along mesh dim ``axis`` (0 while planning on a fake group)."""
    mesh = current_mesh()
    return int(mesh.get_local_rank(_mesh_dim(axis, mesh)))


# ---- raw collectives (no autograd) ---------------------------------------------------------
def _gather(x: torch.Tensor, dim: int, n: int, group: str) -> torch.Tensor:
    out = _c10d.wait_tensor(_c10d.all_gather_into_tensor(x.contiguous(), n, group))
    if dim % x.dim() != 0:  # gathered along dim 0: move the rank blocks to `dim`
        out = torch.cat(torch.chunk(out, n, dim=0), dim=dim)
    return out


def _scatter(x: torch.Tensor, dim: int, n: int, group: str, op: str = "sum") -> torch.Tensor:
    if x.size(dim) % n != 0:
        raise ValueError(
            f"reduce_scatter: dim {dim} of size {x.size(dim)} does not split "
            f"evenly over {n} ranks"
        )
    if dim % x.dim() != 0:
        x = torch.cat(torch.chunk(x, n, dim=dim), dim=0)
    return _c10d.wait_tensor(_c10d.reduce_scatter_tensor(x.contiguous(), op, n, group))


def _reduce(x: torch.Tensor, op: str, group: str) -> torch.Tensor:
    return _c10d.wait_tensor(_c10d.all_reduce(x.contiguous(), op, group))


def _alltoall(x: torch.Tensor, out_splits, in_splits, n: int, group: str) -> torch.Tensor:
    if out_splits is None or in_splits is None:
        if out_splits is not None or in_splits is not None:
            raise ValueError(
                "all_to_all: give both output_split_sizes and input_split_sizes, "
                "or neither (equal splits of dim 0)"
            )
        if x.size(0) % n != 0:
            raise ValueError(
                f"all_to_all: dim 0 of size {x.size(0)} does not split evenly " f"over {n} ranks"
            )
        out_splits = in_splits = [x.size(0) // n] * n
    return _c10d.wait_tensor(
        _c10d.all_to_all_single(x.contiguous(), list(out_splits), list(in_splits), group)
    )


# ---- differentiable wrappers ---------------------------------------------------------------
class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, op):
        _, _, n, group = _group(axis)
        ctx.scale = 1.0 / n if op == "avg" else 1.0
        return _reduce(x, op, group)

    @staticmethod
    def backward(ctx, grad):
        return (grad * ctx.scale if ctx.scale != 1.0 else grad), None, None


class _GradAllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis):
        ctx.group = _group(axis)[3]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _reduce(grad, "sum", ctx.group), None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, axis):
        mesh, mdim, n, group = _group(axis)
        ctx.dim, ctx.n, ctx.index = dim, n, int(mesh.get_local_rank(mdim))
        return _gather(x, dim, n, group)

    @staticmethod
    def backward(ctx, grad):
        return torch.chunk(grad, ctx.n, dim=ctx.dim)[ctx.index].contiguous(), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, axis):
        _, _, n, group = _group(axis)
        ctx.dim, ctx.n, ctx.group = dim, n, group
        return _scatter(x, dim, n, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.dim, ctx.n, ctx.group), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, axis):
        _, _, n, group = _group(axis)
        ctx.n, ctx.group = n, group
        if out_splits is None and in_splits is None:
            out_splits = in_splits = [x.size(0) // n] * n if x.size(0) % n == 0 else None
        ctx.splits = (out_splits, in_splits)
        return _alltoall(x, out_splits, in_splits, n, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _alltoall(grad, in_splits, out_splits, ctx.n, ctx.group), None, None, None


def all_reduce(x: torch.Tensor, axis, op: str = "sum") -> torch.Tensor:
    """Sum (or average, ``op="avg"``) of ``x`` over the ranks of mesh dim ``axis``. Backward:
    the gradient as is (divided by the axis size for "avg"); see the module docstring."""
    if op not in ("sum", "avg"):
        raise ValueError(f"all_reduce: op {op!r} is not differentiable here (sum or avg)")
    return _AllReduce.apply(x, axis, op)


def grad_all_reduce(x: torch.Tensor, axis) -> torch.Tensor:
    """Identity in the forward; the gradient is summed over mesh dim ``axis``. For a value
    that is the same on every rank of ``axis`` but is then used with rank-dependent data."""
    return _GradAllReduce.apply(x, axis)


def all_gather(x: torch.Tensor, gather_dim: int, axis) -> torch.Tensor:
    """Concatenation of every rank's ``x`` along ``gather_dim`` (equal sizes). Backward: this
    rank's chunk of the gradient."""
    return _AllGather.apply(x, gather_dim, axis)


def reduce_scatter(x: torch.Tensor, scatter_dim: int, axis) -> torch.Tensor:
    """Sum over the ranks of ``axis``, of which each keeps its chunk along ``scatter_dim``
    (the dim must split evenly). Backward: all-gather of the gradient."""
    return _ReduceScatter.apply(x, scatter_dim, axis)


def all_to_all(
    x: torch.Tensor,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    axis,
) -> torch.Tensor:
    """Exchange of the dim-0 blocks of ``x`` over ``axis`` (equal blocks when both split
    lists are None). Backward: the exchange back."""
    return _AllToAll.apply(
        x,
        None if output_split_sizes is None else list(output_split_sizes),
        None if input_split_sizes is None else list(input_split_sizes),
        axis,
    )


__all__ = [
    "axis_size",
    "axis_index",
    "all_reduce",
    "grad_all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
]
