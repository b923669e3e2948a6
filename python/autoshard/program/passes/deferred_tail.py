"""The forward's last round trip, not waited for at the end of the forward.

A mean loss over a sharded batch ends the forward with an all-reduce of (loss sum, target
count): the forward cannot return until every rank has reached it, one sync per step that
DDP (which returns each rank's local loss) never pays. It measured 1 ms a step on 2 gloo
ranks and 3-6 ms on 4 ranks sharing 2 cores. What waits for that all-reduce is a few
scalar ops (split, divide); so the forward graph is cut at the wait:

- ``main``: everything else; it issues the all-reduce and returns, among its outputs, the
  values the tail reads (the all-reduce's result, not yet waited for);
- ``epilogue``: the tail (the wait and the scalar ops after it), run once, when its first
  value is needed: a module output read by the user (``loss.item()``, printing, any op),
  or at the latest when the next step's forward starts.

The backward needs the count of targets, not the loss: fuse_reductions.count_targets_early
computes the count from the targets and all-reduces it at the top of the forward, so only
the loss sum's all-reduce is left at the end, and nothing the backward needs waits for it.

A module output the tail makes is returned as a ``DeferredValue``: a tensor whose data
comes from the epilogue on first use; creating a tensor like it (``ones_like``: the seed
``loss.backward()`` starts from) does not need its data, so the backward starts, and
issues its own collectives, while the all-reduce completes. Numerics are unchanged: the
same ops run on the same values, later.

Only nodes after a wait, that make small tensors (<= fuse_reductions.SMALL_NUMEL elements:
scalars, not activations), issue no collective and write no existing tensor, are deferred.
The lowered graphs stay whole for inspection, compile (which runs the whole graph) and the
no-grad forward.

Only where waits block the host (gloo, and any backend not known to do otherwise:
``defers_round_trips``). NCCL's wait is a stream dependency queued on the GPU, the host
returns at once, so deferring it saves nothing, while it costs a tensor subclass on the
loss and, with late_loss_scale.py, an un-waited collective buffer among the saved tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from autoshard.program.passes.fuse_reductions import SMALL_NUMEL
from autoshard.program.graph_nodes import is_collective, is_wait

_aten = torch.ops.aten
# ops that read a tensor's metadata only: they do not need a deferred value's data
_METADATA_ONLY = {_aten.ones_like.default, _aten.zeros_like.default, _aten.empty_like.default}


@dataclass
class SplitForward:
    main: fx.GraphModule  # (forward inputs) -> (outputs it makes..., boundary values...)
    epilogue: fx.GraphModule  # (boundary values...) -> (outputs it makes...)
    from_main: list[int]  # forward output slots main makes, in main's output order
    from_tail: list[int]  # module output slots the epilogue makes (never a saved one)
    tail_vals: list  # their fake values (shape, strides, dtype)


def split_forward(gm: fx.GraphModule, n_outputs: int) -> SplitForward | None:
    """``gm`` (module outputs first, then saved tensors) cut at the waits whose whole
    downstream is small, collective-free and no saved tensor (what the backward needs at
    once is waited for in the forward: deferring it would only move the wait), or None
    when there is no such wait."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    slots = list(output.args[0]) if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    saved = {s for s in slots[n_outputs:] if isinstance(s, fx.Node)}
    tail: set[fx.Node] = set()
    for w in gm.graph.nodes:
        if is_wait(w) and w not in tail:
            below = _downstream(w, output)
            if below is not None and not (below | {w}) & saved:
                tail |= below | {w}
    from_tail = [k for k, s in enumerate(slots) if isinstance(s, fx.Node) and s in tail]
    if not from_tail:
        return None
    from_main = [k for k in range(len(slots)) if k not in from_tail]
    # main's values the tail reads, in graph order
    boundary = [n for n in gm.graph.nodes if n not in tail and any(u in tail for u in n.users)]
    main = _subgraph(
        gm,
        [n for n in gm.graph.nodes if n not in tail and n.op != "output"],
        [slots[k] for k in from_main] + boundary,
        placeholders=None,
    )
    epilogue = _subgraph(
        gm,
        [n for n in gm.graph.nodes if n in tail],
        [slots[k] for k in from_tail],
        placeholders=boundary,
    )
    return SplitForward(
        main, epilogue, from_main, from_tail, [slots[k].meta["val"] for k in from_tail]
    )


def _downstream(w: fx.Node, output: fx.Node) -> set[fx.Node] | None:
    """Every node after ``w`` (not the output), if all make small tensors and none is a
    collective; else None."""
    seen: set[fx.Node] = set()
    stack = [w]
    while stack:
        n = stack.pop()
        if n is not w:
            if n in seen:
                continue
            if is_collective(n) or is_wait(n) or _writes(n) or not _small(n.meta.get("val")):
                return None
            seen.add(n)
        stack.extend(u for u in n.users if u is not output)
    return seen if _small(w.meta.get("val")) else None


def _writes(n: fx.Node) -> bool:
    """An op writing an existing tensor (a buffer or input written back): the write must
    not wait for the user to read an output."""
    return isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable


def _small(val) -> bool:
    vals = val if isinstance(val, (tuple, list)) else [val]
    return bool(vals) and all(
        isinstance(v, torch.Tensor) and v.numel() <= SMALL_NUMEL for v in vals
    )


def _subgraph(
    gm: fx.GraphModule, nodes: list[fx.Node], outputs: list, placeholders: list[fx.Node] | None
) -> fx.GraphModule:
    """A graph of ``nodes`` (in order) returning ``outputs``; ``placeholders``: the nodes
    it takes as inputs instead (None: ``gm``'s own placeholders, kept in ``nodes``)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for p in placeholders or ():
        env[p] = g.placeholder(p.name)
        env[p].meta = dict(p.meta)
    for n in nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output([env[o] if isinstance(o, fx.Node) else o for o in outputs])
    return fx.GraphModule(gm, g)


class PendingTail:
    """One forward's epilogue and the values it reads; run at most once."""

    def __init__(self, split: SplitForward, boundary: list):
        self.split, self.boundary, self.values = split, boundary, None

    def result(self, k: int):
        """Forward output slot ``k`` (one the epilogue makes)."""
        if self.values is None:
            self.values = list(self.split.epilogue(*self.boundary))
            self.boundary = None
        return self.values[self.split.from_tail.index(k)]

    def finish(self) -> None:
        if self.values is None:
            self.result(self.split.from_tail[0])


class DeferredValue(torch.Tensor):
    """A module output whose data is the epilogue's: any op on it runs the epilogue first
    (once) and then works on the real value; making a tensor like it does not."""

    @staticmethod
    def __new__(cls, like: torch.Tensor, pending: PendingTail, slot: int, device: torch.device):
        # like: the fake value the graph recorded for this output (its shape, strides and
        # dtype; the device is the rank's, which a graph lowered on another rank's fake
        # device may not record)
        r = torch.Tensor._make_wrapper_subclass(
            cls, like.shape, strides=like.stride(), dtype=like.dtype, device=device
        )
        r._pending, r._slot = pending, slot
        return r

    def value(self) -> torch.Tensor:
        return self._pending.result(self._slot)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA_ONLY:
            like = args[0]
            return func(
                torch.empty_strided(
                    like.shape, like.stride(), dtype=like.dtype, device=like.device
                ),
                *args[1:],
                **kwargs,
            )
        args, kwargs = pytree.tree_map_only(DeferredValue, lambda d: d.value(), (args, kwargs))
        return func(*args, **kwargs)

    def __repr__(self, *, tensor_contents=None):
        return repr(self.value())


# backends whose wait on a collective queues a dependency on the device's stream and
# returns: the host never blocks, so there is no round trip worth deferring
_STREAM_ORDERED_BACKENDS = frozenset({"nccl", "xccl"})


def defers_round_trips(mesh) -> bool:
    """Whether the program defers the forward's last round trip (this module) and scales
    gradients late (late_loss_scale.py) on ``mesh``: yes unless every mesh dim's process
    group waits on the device (NCCL); gloo's waits block the host."""
    import torch.distributed as dist

    backends = []
    for d in range(mesh.ndim):
        try:
            backends.append(dist.get_backend(mesh.get_group(d)))
        except Exception:  # no process group to ask: keep the passes (the safe side)
            return True
    return not all(
        backend_for_device(b, mesh.device_type) in _STREAM_ORDERED_BACKENDS for b in backends
    )


def backend_for_device(backend: str, device_type: str) -> str:
    """The backend that runs collectives on ``device_type`` tensors: ``backend`` itself, or
    its entry for that device in a per-device spelling ("cpu:gloo,cuda:nccl")."""
    if ":" not in backend:
        return backend.lower()
    per_device = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
    return per_device.get(device_type, "").lower()
