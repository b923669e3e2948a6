"""``autoshard.local_map``: a region of the model written for local shards, with declared
placements, kept as ONE fixed-placement op in the planned step (docs/local_map.md).

``local_map(fn, out_placements, in_placements, in_grad_placements, device_mesh,
redistribute_inputs=...)`` takes torch's ``local_map`` keywords. Called in a traced model,
the region becomes the custom op ``autoshard::local_map(tensors, region, consts)``:

- its fake implementation runs ``fn`` on fake tensors of the LOCAL shapes that the declared
  ``in_placements`` give on the mesh (rank 0's shard), then returns the global shapes the
  ``out_placements`` imply (even shards assumed);
- the graph export gives it a single N-D strategy (the declared layouts), written as the
  user-rule ``strategies`` of docs/formats.md: one row per mesh dim, each with a leading
  "selector" output (a tiny tensor of the mesh's shape) sharded on that mesh dim, and a node
  pin of the selector to ``[S(0), S(1), ...]`` that leaves only the combination taking row i
  on mesh dim i. The planner redistributes the inputs to the declared layouts and the
  outputs leave in theirs;
- its backward is the op ``autoshard::local_map_backward(grads, tensors, region, consts)``,
  planned the same way: output gradients in the output layouts (a Partial output's gradient
  as Replicate), input gradients in ``in_grad_placements`` (default the input layouts, a
  Partial one as Replicate); it recomputes ``fn`` on the local shards under autograd (a
  region that draws random numbers from the generator state its forward started from,
  which the forward returns as one more output);
- on the ranks the runtime runs both on local shards (ops/local_run.py) through their
  local twins ``autoshard::local_map_local`` / ``local_map_backward_local``, which call
  ``fn`` itself.

Outside a trace: DTensor arguments go through torch's ``local_map``; plain tensors call
``fn`` directly (one rank's view), as torch's does.
"""

from __future__ import annotations

import ast
import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.ops import local_map_collectives as collectives
from autoshard.placements import local_shape, placement_to_str


@dataclass
class Region:
    index: int
    fn: Callable
    mesh: Any
    out_layouts: tuple  # per output: a tuple of placements (one per mesh dim)
    single_output: bool  # fn returns one tensor (not a tuple)
    in_layouts: tuple | None  # per positional argument: placements, or None (non-tensor)
    in_grad_layouts: tuple | None
    redistribute_inputs: bool
    # fn draws random numbers (dropout): the forward op also returns the device generator's
    # state from before fn ran, and the backward recomputes fn from that state, so the
    # gradient is that of the values the forward produced (checkpoint's rule)
    random: bool = False
    # what fn returned its outputs as: torch.Tensor (one bare tensor), tuple or list; noted
    # each time fn runs (None: not yet). A traced call returns the same structure, as
    # torch's local_map does (it unflattens fn's own output, whatever the nesting of
    # out_placements)
    container: type | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)


_REGIONS: list[Region] = []  # by index: the ops carry the index
_BY_KEY: dict = {}


def local_map(
    func: Callable | None = None,
    out_placements=None,
    in_placements=None,
    in_grad_placements=None,
    device_mesh=None,
    *,
    redistribute_inputs: bool = False,
):
    """Run ``func`` on local shards with the declared placements; usable as a decorator
    (``@local_map(out_placements=..., ...)``). Keywords as torch's
    ``torch.distributed.tensor.experimental.local_map``:

    - ``out_placements``: the placements of ``func``'s output (one per mesh dim), or a tuple
      of them when ``func`` returns a tuple of tensors;
    - ``in_placements``: one entry per positional argument: its placements, or None for a
      non-tensor argument (int, float, bool, str, None);
    - ``in_grad_placements``: the layout each input's gradient is produced in (default: the
      input's placements, Partial ones as Replicate); docs/local_map.md;
    - ``device_mesh``: the mesh (the plan's mesh); omitted: the mesh of the AutoParallel
      tracing the model when the region is declared or called, else the previous
      ``local_map``'s; an error if none is known at the call;
    - ``redistribute_inputs``: for eager DTensor calls; in a planned model the planner always
      brings the inputs to ``in_placements``.

    Inside ``func`` use ``autoshard.collectives`` (all_reduce, all_gather, ...)."""
    if func is None:
        return lambda f: local_map(
            f,
            out_placements,
            in_placements,
            in_grad_placements,
            device_mesh,
            redistribute_inputs=redistribute_inputs,
        )
    if device_mesh is None:
        # the mesh of the AutoParallel tracing the model now, else the previous local_map's
        device_mesh = collectives.planning_mesh() or collectives._LAST_MESH
    if device_mesh is None:
        # declared before any mesh is known (module level, __init__): the mesh is resolved
        # at the call, inside the trace of the AutoParallel that plans the model
        declared = (out_placements, in_placements, in_grad_placements, bool(redistribute_inputs))
        regions: dict = {}

        @functools.wraps(func)
        def deferred(*args, **kwargs):
            mesh = collectives.planning_mesh() or collectives._LAST_MESH
            if mesh is None:
                raise ValueError(
                    f"autoshard.local_map({getattr(func, '__qualname__', func)!s}): no "
                    "device_mesh: pass device_mesh= (the plan's mesh), or call the region "
                    "inside a model that AutoParallel traces (its mesh is used)"
                )
            if id(mesh) not in regions:
                regions[id(mesh)] = _declare(func, mesh, *declared)
            return regions[id(mesh)](*args, **kwargs)

        return deferred
    return _declare(
        func,
        device_mesh,
        out_placements,
        in_placements,
        in_grad_placements,
        bool(redistribute_inputs),
    )


def _declare(
    func: Callable,
    device_mesh,
    out_placements,
    in_placements,
    in_grad_placements,
    redistribute_inputs: bool,
) -> Callable:
    """The region of ``func`` on ``device_mesh`` (one per distinct declaration)."""
    collectives.set_last_mesh(device_mesh)
    nd = device_mesh.ndim
    what = f"local_map({getattr(func, '__qualname__', func)!s})"
    outs, single = _out_layouts(out_placements, nd, what)
    ins = None if in_placements is None else _in_layouts(in_placements, nd, what, "in_placements")
    grads = (
        None
        if in_grad_placements is None
        else _in_layouts(in_grad_placements, nd, what, "in_grad_placements")
    )
    if ins is not None and grads is not None and len(ins) != len(grads):
        raise ValueError(f"{what}: {len(grads)} in_grad_placements for {len(ins)} inputs")
    key = (func, id(device_mesh), outs, single, ins, grads, bool(redistribute_inputs))
    region = _BY_KEY.get(key)
    if region is None:  # the same declaration (local_map called in forward) is one region
        region = Region(
            len(_REGIONS), func, device_mesh, outs, single, ins, grads, bool(redistribute_inputs)
        )
        _REGIONS.append(region)
        _BY_KEY[key] = region
    rid = region.index

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        return _call(region, args, kwargs)

    wrapped._autoshard_region = rid
    return wrapped


def _is_placements(x) -> bool:
    return isinstance(x, (tuple, list)) and len(x) > 0 and all(isinstance(p, Placement) for p in x)


def _layout(spec, nd: int, what: str) -> tuple:
    if isinstance(spec, Placement):
        spec = (spec,)
    if not _is_placements(spec) or len(spec) != nd:
        raise ValueError(f"{what}: expected {nd} placement(s) (one per mesh dim), got {spec!r}")
    for p in spec:
        if not (
            type(p) in (Shard, Replicate)
            or (type(p) is Partial and p.reduce_op in ("sum", "avg", "max", "min"))
        ):
            raise ValueError(f"{what}: {p!r} is not supported (Shard(d), Replicate(), Partial)")
    return tuple(spec)


def _out_layouts(spec, nd: int, what: str) -> tuple[tuple, bool]:
    if spec is None:
        raise ValueError(f"{what}: out_placements is required")
    if isinstance(spec, Placement) or (_is_placements(spec) and len(spec) == nd):
        return (_layout(spec, nd, f"{what} out_placements"),), True
    if not isinstance(spec, (tuple, list)):
        raise ValueError(
            f"{what}: out_placements {spec!r} is neither placements nor a tuple " "of them"
        )
    outs = []
    for k, s in enumerate(spec):
        if s is None:
            raise ValueError(
                f"{what}: output {k} has placements None: non-tensor outputs are " "not supported"
            )
        outs.append(_layout(s, nd, f"{what} out_placements[{k}]"))
    return tuple(outs), False


def _in_layouts(spec, nd: int, what: str, key: str) -> tuple:
    if not isinstance(spec, (tuple, list)):
        raise ValueError(f"{what}: {key} must be a tuple with one entry per positional argument")
    return tuple(
        None if s is None else _layout(s, nd, f"{what} {key}[{k}]") for k, s in enumerate(spec)
    )


def _traced(tensors: Sequence[torch.Tensor]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    if torch.compiler.is_compiling():
        return True
    for t in tensors:
        if isinstance(t, FakeTensor) or torch._is_functional_tensor(t) or t.device.type == "meta":
            return True
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


def _call(region: Region, args: tuple, kwargs: dict):
    what = f"local_map({region.name})"
    if kwargs:
        raise TypeError(
            f"{what}: keyword arguments are not supported; pass them positionally "
            "(with None in in_placements) or bind them with functools.partial"
        )
    if region.in_layouts is not None and len(region.in_layouts) != len(args):
        raise ValueError(
            f"{what}: {len(region.in_layouts)} in_placements for {len(args)} "
            "positional arguments"
        )
    if any(isinstance(a, DTensor) for a in args):
        from torch.distributed.tensor.experimental import local_map as torch_local_map

        with collectives.running_on(region.mesh):
            return torch_local_map(
                region.fn,
                region.out_layouts if not region.single_output else (region.out_layouts[0],),
                region.in_layouts,
                region.in_grad_layouts,
                region.mesh,
                redistribute_inputs=region.redistribute_inputs,
            )(*args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not _traced(tensors):
        with collectives.running_on(region.mesh):
            return region.fn(*args)
    if region.in_layouts is None:
        raise ValueError(f"{what}: in_placements is required in a planned model")
    consts = []
    for k, (a, lay) in enumerate(zip(args, region.in_layouts)):
        if isinstance(a, torch.Tensor):
            if lay is None:
                raise ValueError(
                    f"{what}: argument {k} is a tensor but its in_placements " "entry is None"
                )
        else:
            if lay is not None:
                raise ValueError(
                    f"{what}: argument {k} ({type(a).__name__}) is not a tensor "
                    "but has placements; give None"
                )
            if not isinstance(a, (int, float, bool, str, type(None))):
                raise TypeError(
                    f"{what}: argument {k} is a {type(a).__name__}; a planned "
                    "region takes tensors, int, float, bool, str or None (bind "
                    "other values with functools.partial)"
                )
            consts.append((k, a))
    out = torch.ops.autoshard.local_map.default(tensors, region.index, repr(tuple(consts)))
    outs = out[1 : 1 + len(region.out_layouts)]  # after the selector; before a random state
    return _as_fn_returned(region, list(outs))


def _as_fn_returned(region: Region, outs: list):
    """The op's outputs in the structure ``fn`` returned them in (its fake run noted it): a
    bare tensor for a function returning one tensor, even when out_placements is written
    as a 1-tuple of placements (``((Shard(0),),)``), as torch's local_map does."""
    container = region.container
    if container is None:  # fn has not run in this process (a cached fake result)
        container = torch.Tensor if region.single_output else tuple
    return outs[0] if container is torch.Tensor else container(outs)


# ---- the ops --------------------------------------------------------------------------------
def _args(region: Region, tensors: Sequence[torch.Tensor], consts: str) -> list:
    fixed = dict(ast.literal_eval(consts))
    it = iter(tensors)
    return [fixed[k] if k in fixed else next(it) for k in range(len(tensors) + len(fixed))]


def _tensor_layouts(region: Region) -> list[tuple]:
    return [lay for lay in region.in_layouts if lay is not None]


def _grad_layouts(region: Region) -> list[tuple]:
    """Layout of each tensor input's gradient: in_grad_placements, default the input's,
    Partial as Replicate (the gradient of a sum is the same full value for every term)."""
    ins = region.in_layouts
    given = region.in_grad_layouts or (None,) * len(ins)
    return [
        g if g is not None else tuple(Replicate() if isinstance(p, Partial) else p for p in lay)
        for lay, g in zip(ins, given)
        if lay is not None
    ]


def _out_grad_layouts(region: Region) -> list[tuple]:
    """Layout the output gradients arrive in: the output's, full values (Partial -> R)."""
    return [
        tuple(Replicate() if isinstance(p, Partial) else p for p in lay)
        for lay in region.out_layouts
    ]


def _differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _coords(mesh) -> list[int]:
    c = mesh.get_coordinate()
    return list(c) if c is not None else [0] * mesh.ndim


def _global_shape(local: Sequence[int], layout: tuple, mesh) -> list[int]:
    shape = list(local)
    for i, p in enumerate(layout):
        if isinstance(p, Shard):
            shape[p.dim % len(shape)] *= int(mesh.size(i))
    return shape


def _selector(like: torch.Tensor, mesh, local: bool) -> torch.Tensor:
    shape = [1] * mesh.ndim if local else [int(s) for s in mesh.shape]
    return like.new_zeros(shape, dtype=torch.float32) if like is not None else torch.zeros(shape)


def _run_fn(region: Region, args: list) -> list[torch.Tensor]:
    with collectives.running_on(region.mesh):
        out = region.fn(*args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    region.container = type(out) if type(out) in (tuple, list) else torch.Tensor
    if region.single_output and isinstance(out, (tuple, list)) and len(outs) != 1:
        raise ValueError(
            f"local_map({region.name}): returns a {type(out).__name__} but "
            "out_placements declares one output"
        )
    if len(outs) != len(region.out_layouts) or not all(isinstance(o, torch.Tensor) for o in outs):
        raise ValueError(
            f"local_map({region.name}): returns {len(outs)} value(s) "
            f"({[type(o).__name__ for o in outs]}) but out_placements declares "
            f"{len(region.out_layouts)} tensor output(s)"
        )
    return outs


def _fake_local_inputs(region: Region, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    mesh = region.mesh
    coords = _coords(mesh)
    local = []
    for t, lay in zip(tensors, _tensor_layouts(region)):
        shape = local_shape([int(s) for s in t.shape], lay, list(mesh.shape), coords)
        local.append(t.new_empty(shape))
    return local


@torch.library.custom_op("autoshard::local_map", mutates_args=())
def _region(tensors: list[torch.Tensor], region: int, consts: str) -> list[torch.Tensor]:
    # run for real only where a graph holding it is executed outside autoshard's runtime:
    # the tensors are taken as this rank's shards
    return _local_impl(tensors, region, consts)


@_region.register_fake
def _(tensors, region, consts):
    r = _REGIONS[region]
    local = _fake_local_inputs(r, tensors)
    with torch.no_grad(), _RandomOps() as seen:
        outs = _run_fn(r, _args(r, local, consts))
    r.random = seen.drawn
    like = tensors[0] if tensors else None
    return (
        [_selector(like, r.mesh, False)]
        + [o.new_empty(_global_shape(o.shape, lay, r.mesh)) for o, lay in zip(outs, r.out_layouts)]
        + _fake_rng_state(r, like)
    )


@torch.library.custom_op("autoshard::local_map_local", mutates_args=())
def _region_local(tensors: list[torch.Tensor], region: int, consts: str) -> list[torch.Tensor]:
    return _local_impl(tensors, region, consts)


def _local_impl(tensors, region, consts):
    r = _REGIONS[region]
    like = tensors[0] if tensors else None
    state = [_rng_state(_device(like))] if r.random else []
    with torch.no_grad():
        outs = _run_fn(r, _args(r, list(tensors), consts))
    return [_selector(like, r.mesh, True)] + _unaliased(outs, tensors) + state


def _unaliased(outs: list, inputs: Sequence[torch.Tensor]) -> list:
    """Contiguous results sharing no storage with the inputs or each other (a custom op's
    contract), copied only where needed."""
    seen = {t.untyped_storage().data_ptr() for t in inputs}
    done = []
    for o in outs:
        ptr = o.untyped_storage().data_ptr()
        o = o.clone(memory_format=torch.contiguous_format) if ptr in seen else o.contiguous()
        seen.add(o.untyped_storage().data_ptr())
        done.append(o)
    return done


@_region_local.register_fake
def _(tensors, region, consts):
    r = _REGIONS[region]
    with torch.no_grad():
        outs = _run_fn(r, _args(r, list(tensors), consts))
    like = tensors[0] if tensors else None
    return (
        [_selector(like, r.mesh, True)]
        + [o.new_empty(o.shape) for o in outs]
        + _fake_rng_state(r, like)
    )


@torch.library.custom_op("autoshard::local_map_backward", mutates_args=())
def _region_backward(
    grads: list[torch.Tensor], tensors: list[torch.Tensor], region: int, consts: str
) -> list[torch.Tensor]:
    return _backward_impl(grads, tensors, region, consts)


def _backward_fake(tensors, region: int, local: bool) -> list[torch.Tensor]:
    """The selector and one gradient per differentiable input (the inputs' shapes: global
    for the planned op, local for its twin)."""
    like = tensors[0] if tensors else None
    return [_selector(like, _REGIONS[region].mesh, local)] + [
        t.new_empty(t.shape) for t in tensors if _differentiable(t)
    ]


@_region_backward.register_fake
def _(grads, tensors, region, consts):
    return _backward_fake(tensors, region, False)


@torch.library.custom_op("autoshard::local_map_backward_local", mutates_args=())
def _region_backward_local(
    grads: list[torch.Tensor], tensors: list[torch.Tensor], region: int, consts: str
) -> list[torch.Tensor]:
    return _backward_impl(grads, tensors, region, consts)


@_region_backward_local.register_fake
def _(grads, tensors, region, consts):
    return _backward_fake(tensors, region, True)


def _backward_impl(grads, tensors, region, consts):
    """Recompute ``fn`` on the local shards under autograd (a random region from the
    generator state its forward started from: ``tensors`` ends with it); the gradient of
    every floating-point input (zeros where it does not reach the outputs)."""
    r = _REGIONS[region]
    state = tensors[-1] if r.random else None
    tensors = list(tensors[:-1]) if r.random else tensors
    inputs = [t.detach().requires_grad_(_differentiable(t)) for t in tensors]
    with _autograd_dispatch(), torch.enable_grad(), _rng_state_set(state, inputs):
        outs = _run_fn(r, _args(r, inputs, consts))
    wrt = [t for t in inputs if t.requires_grad]
    pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
    got = (
        torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
        if pairs and wrt
        else [None] * len(wrt)
    )
    like = tensors[0] if tensors else None
    got = [torch.zeros_like(t) if g is None else g for t, g in zip(wrt, got)]
    return [_selector(like, r.mesh, True)] + _unaliased(got, list(grads) + list(tensors))


def _autograd_dispatch():
    """A custom op's kernel runs with the autograd dispatch keys excluded (it is below
    autograd), so ops inside it record no graph even under enable_grad: include them again
    for the recomputation."""
    C = torch._C
    excluded = C._dispatch_tls_local_exclude_set()
    for key in (
        C.DispatchKey.AutogradFunctionality,
        C.DispatchKey.AutogradOther,
        C.DispatchKey.AutogradNestedTensor,
    ):
        excluded = excluded.remove(key)
    return C._ForceDispatchKeyGuard(C._dispatch_tls_local_include_set(), excluded)


def _setup_context(ctx, inputs, output) -> None:
    tensors, region, consts = inputs
    # a random region's last output (the generator state) goes to the backward as its
    # last input
    random = _REGIONS[region].random
    ctx.save_for_backward(*tensors, *(output[-1:] if random else ()))
    ctx.region, ctx.consts, ctx.n_tensors = region, consts, len(tensors)
    ctx.out_meta = [(o.shape, o.dtype) for o in output[1 : len(output) - random]]


def _autograd_backward(ctx, grads):
    saved = list(ctx.saved_tensors)
    tensors = saved[: ctx.n_tensors]
    outs = [
        g if g is not None else torch.zeros(s, dtype=d, device=tensors[0].device)
        for g, (s, d) in zip(list(grads)[1:], ctx.out_meta)
    ]
    res = iter(
        torch.ops.autoshard.local_map_backward.default(outs, saved, ctx.region, ctx.consts)[1:]
    )
    return [next(res) if _differentiable(t) else None for t in tensors], None, None


_region.register_autograd(_autograd_backward, setup_context=_setup_context)

_FWD = torch.ops.autoshard.local_map.default
_BWD = torch.ops.autoshard.local_map_backward.default


class _RandomOps(TorchDispatchMode):
    """Notes whether any op run under it draws random numbers."""

    drawn = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.drawn = True
        return func(*args, **(kwargs or {}))


def _device(like: torch.Tensor | None) -> torch.device:
    return like.device if like is not None else torch.device("cpu")


def _rng_state(device: torch.device) -> torch.Tensor:
    """The state of ``device``'s default generator (a CPU byte tensor, as torch keeps it)."""
    if device.type in ("cpu", "meta"):
        return torch.get_rng_state()
    return torch.get_device_module(device.type).get_rng_state(device)


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type in ("cpu", "meta"):
        torch.set_rng_state(state)
    else:
        torch.get_device_module(device.type).set_rng_state(state, device)


def _fake_rng_state(r: Region, like: torch.Tensor | None) -> list[torch.Tensor]:
    if not r.random:
        return []
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        size = _rng_state(_device(like)).numel()
    return [torch.empty(size, dtype=torch.uint8, device="cpu")]


@contextlib.contextmanager
def _rng_state_set(state: torch.Tensor | None, inputs: list[torch.Tensor]):
    """Runs the block from generator ``state`` (None: as is), then puts back the state the
    generator had (the recomputation draws nothing from the step's sequence)."""
    if state is None:
        yield
        return
    device = _device(inputs[0] if inputs else None)
    before = _rng_state(device)
    _set_rng_state(device, state)
    try:
        yield
    finally:
        _set_rng_state(device, before)


# ---- planning: the single declared strategy ---------------------------------------------------
def _check_mesh(r: Region, specs: list) -> None:
    plan_mesh = next((s.mesh for s in specs if hasattr(s, "mesh")), None)
    if plan_mesh is None:
        return
    if tuple(plan_mesh.shape) != tuple(r.mesh.shape) or tuple(
        plan_mesh.mesh_dim_names or ()
    ) != tuple(r.mesh.mesh_dim_names or ()):
        raise ValueError(
            f"local_map({r.name}) is declared on a mesh of shape "
            f"{tuple(r.mesh.shape)} {r.mesh.mesh_dim_names} but the plan's mesh is "
            f"{tuple(plan_mesh.shape)} {plan_mesh.mesh_dim_names}; pass the plan's "
            "mesh as device_mesh"
        )


def _rows(out_cols: list[tuple], in_cols: list[tuple], nd: int) -> list:
    """One single-mesh-dim row per mesh dim: row i has the selector sharded on dim i."""
    return [
        ([Shard(i)] + [lay[i] for lay in out_cols], [lay[i] for lay in in_cols]) for i in range(nd)
    ]


def _forward_rule(tensors, region, consts):
    r = _REGIONS[region]
    _check_mesh(r, tensors)
    return _rows(list(r.out_layouts) + _rng_state_layout(r), _tensor_layouts(r), r.mesh.ndim)


def _backward_rule(grads, tensors, region, consts):
    r = _REGIONS[region]
    _check_mesh(r, tensors)
    diff = [g for g, t in zip(_grad_layouts(r), tensors) if _differentiable_spec(t)]
    ins = _out_grad_layouts(r) + _tensor_layouts(r) + _rng_state_layout(r)
    return _rows(diff, ins, r.mesh.ndim)


def _rng_state_layout(r: Region) -> list[tuple]:
    """A random region's generator state: each rank's own, never moved (Replicate)."""
    return [(Replicate(),) * r.mesh.ndim] if r.random else []


def _differentiable_spec(spec) -> bool:
    dtype = spec.tensor_meta.dtype if getattr(spec, "tensor_meta", None) is not None else None
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


def selector_layout(nd: int) -> list[str]:
    return [placement_to_str(Shard(i)) for i in range(nd)]


def region_pins(gm) -> dict[str, tuple[list[str], str]]:
    """Node pins of every region op of ``gm``: its selector output (output 0) to
    [S(0), S(1), ...], which keeps only the declared N-D strategy."""
    pins = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (_FWD, _BWD):
            r = _REGIONS[n.args[2] if n.target is _BWD else n.args[1]]
            # the region's declaration, under the key AutoParallel's local_map nodes use
            n.meta["local_map_kwargs"] = {
                "out_placements": r.out_layouts if not r.single_output else r.out_layouts[0],
                "in_placements": r.in_layouts,
                "in_grad_placements": r.in_grad_layouts,
                "device_mesh": r.mesh,
                "redistribute_inputs": r.redistribute_inputs,
            }
            # (the API reports a pin whose length is not the plan mesh's as
            # "with_sharding_constraint<where>: ...": say which region and mesh)
            pins[n.name] = (
                selector_layout(r.mesh.ndim),
                f" of local_map({r.name}), declared on the mesh "
                f"{tuple(r.mesh.shape)} {r.mesh.mesh_dim_names} (pass the plan's "
                "mesh as device_mesh)",
            )
    return pins


def _register() -> None:
    from autoshard.ops import user_rules
    from autoshard.ops.local_run import register_local_op

    user_rules._REGISTERED[_FWD] = _forward_rule
    user_rules._REGISTERED[_BWD] = _backward_rule
    register_local_op(_FWD, torch.ops.autoshard.local_map_local.default)
    register_local_op(_BWD, torch.ops.autoshard.local_map_backward_local.default)


_register()
