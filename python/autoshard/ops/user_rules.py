"""Sharding rules users give for their own ops (``torch.library.custom_op``) or to replace
autoshard's rule of an ATen op.

A rule is DTensor's: a function registered with torch's public
``torch.distributed.tensor.experimental.register_sharding`` (or ``autoshard.register_sharding``,
the same decorator). Honouring that registry means one rule serves both halves: DTensor runs
the op with it (the runtime lowers the plan through DTensor), and the graph export evaluates
it on each node's arguments for the plan's mesh and writes the returned single-mesh-dim
strategies into the node (``strategies``, docs/formats.md section 1), which the C++ planner
expands to the mesh instead of looking up a rule of its own. docs/rules.md, "User rules".
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map_only
from torch.distributed.tensor import Partial, Replicate, Shard

# ops registered through autoshard.register_sharding -> the user's function; a fallback for
# finding them should DTensor's propagator store its rules differently in a later torch
_REGISTERED: dict[Any, Callable] = {}


def register_sharding(op):
    """Register a sharding rule for ``op`` (an OpOverload or a list of them): the same
    decorator, arguments and rule function as
    ``torch.distributed.tensor.experimental.register_sharding``, which it calls, so DTensor
    runs the op with the rule; autoshard plans with it too. Rules registered with torch's
    decorator directly are honoured as well.

    The function takes the op's arguments, each tensor replaced by a ``DTensorSpec`` (its
    ``.shape``, ``.ndim``, ``.tensor_meta``; ``.mesh`` is the plan's mesh), and returns a list
    of ``(output_placements, input_placements)`` for ONE mesh dim: one placement per op
    return, and one per argument (``None`` for arguments that are not tensors). autoshard
    takes every combination of them over the mesh dims, as DTensor does; include the
    all-``Replicate()`` strategy, nothing is added.

    An op with both a rule built into autoshard and a user rule is planned with the user rule.
    (For an ATen op whose DTensor rule is one of DTensor's single-dim strategies, DTensor's own
    rule still decides at run time, so such an override may not run as planned.)

    Example::

        @autoshard.register_sharding(torch.ops.mylib.rowscale.default)
        def rowscale_rule(x, w):
            return [([Replicate()], [Replicate(), Replicate()]),
                    ([Shard(0)], [Shard(0), Replicate()])]
    """
    from torch.distributed.tensor.experimental import register_sharding as torch_register

    overloads = op if isinstance(op, list) else [op]

    def wrapper(fn: Callable) -> Callable:
        torch_register(op)(fn)
        for o in overloads:
            _REGISTERED[o] = fn
        return fn

    return wrapper


def user_rule_of(op: Any) -> Callable | None:
    """The user function registered for ``op`` through register_sharding, else None.

    torch's decorator stores ``partial(custom_strategy, fn)`` in the propagator's
    ``op_strategy_funcs``; DTensor's built-in strategies are plain functions, so a partial of
    register_sharding's inner function tells a user rule apart. autoshard's own record is
    the fallback for a torch that stores them differently."""
    from torch.distributed.tensor import DTensor

    funcs = getattr(DTensor._op_dispatcher.sharding_propagator, "op_strategy_funcs", {})
    f = funcs.get(op)
    if (
        isinstance(f, functools.partial)
        and f.args
        and getattr(f.func, "__qualname__", "").startswith("register_sharding.")
    ):
        return f.args[0]
    return _REGISTERED.get(op)


def node_strategies(node: fx.Node, mesh, source: str | None = None) -> list[dict] | None:
    """The user rule of ``node``'s op evaluated on its arguments for ``mesh``: its
    strategies as the graph JSON writes them (``{"outputs": [...], "inputs": [...]}``, one
    placement string per output and per tensor input), or None when the op has no user rule.
    A rule that fails or returns something malformed is a ValueError naming the op, the rule
    and what is wrong."""
    fn = user_rule_of(node.target)
    if fn is None:
        return None
    _warn_if_dtensor_keeps_its_rule(node.target)
    where = f"node {node.name!r} ({node.target}{', ' + source if source else ''})"
    rule = f"the sharding rule {getattr(fn, '__qualname__', repr(fn))} registered for {node.target}"
    if mesh is None:
        raise ValueError(
            f"{where} has a user sharding rule, which is evaluated for the plan's "
            "mesh: export the graph with the mesh (graph_json(step, mesh=...))"
        )
    specs = _ArgSpecs(mesh)
    args = tree_map_only(fx.Node, specs, node.args)
    kwargs = tree_map_only(fx.Node, specs, dict(node.kwargs))
    try:
        returned = list(fn(*args, **kwargs))
    except Exception as e:
        raise ValueError(f"{rule} raised on {where}: {type(e).__name__}: {e}") from e
    if not returned:
        raise ValueError(
            f"{rule} returned no strategy for {where}; return at least the " "all-Replicate one"
        )
    outs = _output_metas(node)
    return [
        _row(r, i, outs, specs.inputs, f"{rule}, strategy {i} for {where}")
        for i, r in enumerate(returned)
    ]


_WARNED: set = set()


def _warn_if_dtensor_keeps_its_rule(op) -> None:
    """DTensor consults its single-dim strategies before register_sharding's, so for such an
    ATen op the plan follows the user rule while the run follows DTensor's: say so once."""
    from torch.distributed.tensor import DTensor

    prop = DTensor._op_dispatcher.sharding_propagator
    if op in getattr(prop, "op_single_dim_strategy_funcs", {}) and op not in _WARNED:
        _WARNED.add(op)
        warnings.warn(
            f"{op} has a user sharding rule, which autoshard plans with, but DTensor "
            "runs it with its own single-dim strategy; the run may redistribute "
            "around it (or fail in strict mode) where the two disagree",
            RuntimeWarning,
            stacklevel=3,
        )


class _ArgSpecs:
    """Maps each tensor argument to the DTensorSpec DTensor's own call would pass (all
    Replicate on the mesh: the rule must not depend on the current layout), recording the
    tensors in the order the planner numbers tensor inputs (args then kwargs, depth-first)."""

    def __init__(self, mesh):
        self.mesh = mesh
        self.inputs: list[torch.Tensor] = []

    def __call__(self, arg: fx.Node):
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        val = arg.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return val
        self.inputs.append(val)
        meta = TensorMeta(
            torch.Size(int(s) for s in val.shape), tuple(int(s) for s in val.stride()), val.dtype
        )
        return DTensorSpec(self.mesh, (Replicate(),) * self.mesh.ndim, tensor_meta=meta)


def _output_metas(node: fx.Node) -> list[torch.Tensor | None]:
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    return [v if isinstance(v, torch.Tensor) else None for v in vals]


def _row(returned: Any, index: int, outs: list, ins: list, what: str) -> dict:
    if not (isinstance(returned, (list, tuple)) and len(returned) == 2):
        raise ValueError(
            f"{what}: expected a pair (output placements, input placements), " f"got {returned!r}"
        )
    out_ps, in_ps = returned
    for name, ps in (("output", out_ps), ("input", in_ps)):
        if not isinstance(ps, (list, tuple)):
            raise ValueError(f"{what}: the {name} placements must be a list, got {ps!r}")
    if type(out_ps) is not type(in_ps):
        raise ValueError(
            f"{what}: the output placements are a {type(out_ps).__name__} and the "
            f"input placements a {type(in_ps).__name__}; DTensor concatenates them "
            "(outputs + inputs), so use lists for both"
        )
    if len(out_ps) != len(outs):
        raise ValueError(
            f"{what}: {len(out_ps)} output placement(s), but the op returns "
            f"{len(outs)} value(s)"
        )
    given = [p for p in in_ps if p is not None]
    if len(given) != len(ins):
        raise ValueError(
            f"{what}: {len(given)} input placement(s) that are not None, but the "
            f"op is called with {len(ins)} tensor(s); give one placement per "
            "tensor argument and None for every other argument"
        )
    out_strs = []
    for k, (p, t) in enumerate(zip(out_ps, outs)):
        if t is None:
            out_strs.append(None)  # not a tensor: nothing to place
        elif p is None:
            raise ValueError(f"{what}: output {k} is a tensor but its placement is None")
        else:
            out_strs.append(_placement_str(p, t, f"{what}: output {k}"))
    in_strs = [
        _placement_str(p, t, f"{what}: tensor input {a}")
        for a, (p, t) in enumerate(zip(given, ins))
    ]
    return {"outputs": out_strs, "inputs": in_strs}


def _placement_str(p: Any, tensor: torch.Tensor, what: str) -> str:
    """The planner's string of ``p`` (placements.placement_to_str) once it is checked
    against the tensor it places: a Shard dim in range (negative ones counted from the end),
    and only the placements autoshard plans with."""
    from autoshard.placements import placement_to_str

    if type(p) is Shard:
        d = p.dim + tensor.ndim if p.dim < 0 else p.dim
        if not 0 <= d < tensor.ndim:
            raise ValueError(
                f"{what}: Shard({p.dim}) is out of range for a tensor with "
                f"{tensor.ndim} dim(s) (shape {list(tensor.shape)})"
            )
        return placement_to_str(Shard(d))
    if type(p) is Replicate or (type(p) is Partial and p.reduce_op in ("sum", "avg", "max", "min")):
        return placement_to_str(p)
    raise ValueError(
        f"{what}: {p!r} is not supported by autoshard (only Shard(d), Replicate() "
        "and Partial with sum, avg, max or min)"
    )
