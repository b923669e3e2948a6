"""Running a plan: the joint graph interpreted node by node on DTensors.

Forward: every node that does not read a tangent runs when the module is called; the values
the backward nodes read are kept. Backward (``loss.backward()``): the remaining nodes run
with the incoming gradients as tangents. Before each node, every tensor argument is
redistributed (``DTensor.redistribute``: PyTorch's collectives on the mesh's process groups)
from its producer's layout to the layout the plan gives that input, once per pass and value
and layout (later consumers reuse it; the backward reuses the forward's small ones, such as
the loss's normaliser, instead of communicating them again); the node then runs as a
DTensor op, and its result is checked against the plan's output layout: DTensor's own
sharding propagation must land exactly where the plan says. In strict mode a difference
raises; otherwise the result is redistributed to the planned layout and counted in
``warnings``. Gradients leave in their parameter's at-rest layout.

A plan may leave nodes (or their inputs/outputs) out: then the producer's layout is used as
is, and DTensor's choice is accepted. ``recorded_plan()`` returns the complete plan that was
actually executed, which is how hand-written partial plans become complete ones in tests.
"""

from __future__ import annotations

import logging
import operator
from collections import Counter
from typing import Any, Sequence

import torch
import torch.distributed.config as dist_config
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from autoshard.ops import context_parallel, varlen_attention
from autoshard.ops.flex_attention import LocalBlockMasks
from autoshard.ops.local_run import OUTPUT_SIZE_ARGS, local_impl, runs_locally
from autoshard.placements import layout_from_strs, layout_to_strs, local_shape, normalize_placements
from autoshard.trace.step_schedule import BACKWARD, FORWARD
from autoshard.trace.traced_step import TracedStep

log = logging.getLogger("autoshard")

_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)
# env key of the pass's redistributed values: {(node name, layout strs): DTensor}; not a
# valid FX node name, so it never collides with one
REDISTRIBUTED = "<redistributed>"
# the largest value (elements, global) the backward reuses from the forward's
# redistributions instead of communicating again; larger ones are redistributed again, as
# the plan's memory estimate assumes
REUSE_MAX_NUMEL = 1 << 16


class PlanMismatchError(RuntimeError):
    """DTensor produced a layout the plan did not ask for (strict mode)."""


def contiguous_stride(shape: Sequence[int]) -> tuple:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= torch.sym_max(s, 1)  # a size symbol (uneven shard) stays one, unguarded
    return tuple(reversed(stride))


def rank_varying_dims(shape: Sequence[int], layout, mesh: DeviceMesh) -> list[int]:
    """The dims of a ``shape`` tensor in ``layout`` whose local size differs by rank (uneven
    shards). torch.chunk's chunks are equal but the trailing ones, which are smaller, so
    the first and the last coordinate tell."""
    first = local_shape(shape, layout, mesh.shape, [0] * mesh.ndim)
    last = local_shape(shape, layout, mesh.shape, [s - 1 for s in mesh.shape])
    return [d for d, (a, b) in enumerate(zip(first, last)) if a != b]


def tracing_for_every_rank() -> bool:
    """True while torch's ``compile_on_one_rank`` traces one program for every rank: the
    mesh coordinates are then a runtime op, not this rank's numbers."""
    from torch._guards import detect_fake_mode

    if not dist_config.compile_on_one_rank:
        return False
    mode = detect_fake_mode()
    return mode is not None and mode.shape_env is not None


def rank_local_shape(shape: Sequence[int], layout, mesh: DeviceMesh) -> list:
    """This rank's shard shape of a ``shape`` tensor in ``layout``. While one program is
    traced for every rank (tracing_for_every_rank), a dim sharded unevenly has a size that
    depends on the rank: a symbolic size computed from the runtime mesh coordinate, by
    DTensor's own rule."""
    if tracing_for_every_rank() and rank_varying_dims(shape, layout, mesh):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        sizes, _ = compute_local_shape_and_global_offset(
            tuple(shape), mesh, tuple(layout), skip_offset=True
        )
        return list(sizes)
    return local_shape(shape, layout, mesh.shape, mesh.get_coordinate() or [0] * mesh.ndim)


def zero_unless_first(local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int) -> torch.Tensor:
    """``local`` on the ranks at coordinate 0 of ``mesh_dim``, exact zeros elsewhere (a sum
    Partial made from a replicated value). The coordinate is a runtime value when the program
    is traced for every rank at once (compile_on_one_rank), else this rank's."""
    coord = mesh._sym_get_coordinate(mesh_dim)
    if isinstance(coord, int):
        return local if coord == 0 else torch.zeros_like(local)
    keep = torch.scalar_tensor(coord, dtype=torch.int64, device=local.device) == 0
    return torch.where(keep, local, torch.zeros((), dtype=local.dtype, device=local.device))


def tensor_refs(args: Any, kwargs: dict) -> list[fx.Node]:
    """Node references in args then kwargs, depth first (the plan's ``inputs`` order)."""
    refs: list[fx.Node] = []
    fx.node.map_arg((args, kwargs), refs.append)  # (torch's C walk; its results unused)
    return refs


def _node_source(node: fx.Node) -> str:
    from autoshard.user_frames import source_line

    src = source_line(node)
    return f" (from {src})" if src else ""


class StepRunner:
    """Executes one traced step under one plan on one mesh. Stateless between steps, but for
    caches whose entries serve only the very same inputs."""

    def __init__(
        self,
        step: TracedStep,
        plan: dict,
        mesh: DeviceMesh,
        *,
        strict: bool = False,
        device: torch.device | None = None,
    ):
        self.step = step
        self.gm = step.gm
        self.mesh = mesh
        self.strict = strict
        self.plan_nodes: dict = dict(plan.get("nodes", {}))
        self.device = device or _mesh_device(mesh)
        self.warnings: Counter = Counter()
        self.recorded: dict[str, dict] = {}
        self._layout_cache: dict = {}
        # FlexAttention block masks rebuilt for this rank's positions, shared by the layers'
        # calls (a cache: an entry serves only the very same mask inputs)
        self.block_masks = LocalBlockMasks()
        # the forward / backward split and the values crossing it: the step's schedule, the
        # same one the planner priced (trace/step_schedule.py)
        # with the plan's recomputed nodes, which the backward runs again (step_schedule.py)
        schedule = step.schedule.with_recompute(self.gm, plan.get("recompute", ()))
        self.schedule = schedule
        self.forward_nodes: list[fx.Node] = schedule.nodes_run_in(self.gm, FORWARD)
        self.backward_nodes: list[fx.Node] = schedule.backward_order(self.gm)
        self.saved_names = set(schedule.saved)
        self.reused_across = self._small_redistributions_done_twice()
        self.param_names = list(step.param_fqns)
        self.buffer_names = list(step.buffer_fqns)
        self.placeholders = {n.name: n for n in self.gm.graph.find_nodes(op="placeholder")}
        # tensor constants (get_attr) are graph inputs to the planner, exported like buffers
        self.constants = {
            n.name: getattr(self.gm, n.target)
            for n in self.gm.graph.find_nodes(op="get_attr")
            if isinstance(getattr(self.gm, n.target, None), torch.Tensor)
        }
        self._device_constants: dict = {}  # (name, device) -> the constant copied there
        for n in self.gm.graph.find_nodes(op="get_attr"):
            if n.name in self.constants:
                self.placeholders[n.name] = n
                n.meta.setdefault("val", self.constants[n.name])
        self.fwd_outputs = sorted(
            (o for o in step.outputs if o.role == "output"), key=lambda o: o.output_index
        )
        self.grad_outputs = {o.grad_of: o for o in step.outputs if o.role == "grad"}
        # buffers and inputs forward() writes in place (their new values)
        self.written = [o for o in step.outputs if o.role == "mutation"]
        self.tangent_by_output = {idx: name for name, idx in step.tangent_of.items()}
        self.graph_output_layouts = plan.get("graph_outputs")
        self.graph_output_order = [id(o) for o in step.outputs if isinstance(o.node, fx.Node)]
        self.recorded_tangents: dict[str, list] = {}
        self.recorded_output_layouts: dict[int, tuple] = {}

    def _small_redistributions_done_twice(self) -> set:
        """(value, layout) pairs both passes redistribute that are small enough to save
        instead of communicating twice (loss scalars, norm weights): the backward reuses
        the forward's result."""

        def wanted(nodes):
            out = set()
            for n in nodes:
                planned = (self.plan_nodes.get(n.name) or {}).get("inputs")
                if planned is None:
                    continue
                for ref, strs in zip(tensor_refs(n.args, n.kwargs), planned):
                    val = ref.meta.get("val")
                    if (
                        strs is not None
                        and isinstance(val, torch.Tensor)
                        and val.numel() <= REUSE_MAX_NUMEL
                    ):
                        out.add((ref.name, tuple(strs)))
            return out

        # a recomputed node redistributes its inputs again (reusing the forward's would keep
        # them: what recomputing saves), and a recomputed value is not kept in any layout
        own_backward = self.schedule.nodes_run_in(self.gm, BACKWARD)
        both = wanted(self.forward_nodes) & wanted(own_backward)
        return {(name, strs) for name, strs in both if name not in self.schedule.recompute}

    # ---- layouts -------------------------------------------------------------------------
    def _layout(self, strs, what: str):
        key = tuple(strs)
        if key not in self._layout_cache:
            self._layout_cache[key] = layout_from_strs(strs, self.mesh.ndim, what)
        return self._layout_cache[key]

    def planned_output(self, name: str, k: int = 0):
        entry = self.plan_nodes.get(name)
        if not entry or "outputs" not in entry or k >= len(entry["outputs"]):
            return None
        strs = entry["outputs"][k]
        return None if strs is None else self._layout(strs, f"plan node {name} output {k}")

    def placeholder_layout(self, name: str):
        layout = self.planned_output(name)
        if layout is None:
            layout = (Replicate(),) * self.mesh.ndim
        if any(p.is_partial() for p in layout):
            raise ValueError(
                f"plan gives placeholder {name} the layout "
                f"{layout_to_strs(layout)}: graph inputs cannot be Partial"
            )
        return layout

    def global_shape(self, name: str) -> tuple:
        return tuple(int(s) for s in self.placeholders[name].meta["val"].shape)

    def expected_local_shape(self, name: str) -> list[int]:
        return rank_local_shape(self.global_shape(name), self.placeholder_layout(name), self.mesh)

    def placeholder_varying_dims(self, name: str) -> list[int]:
        """Dims of placeholder ``name``'s local tensor whose size differs by rank."""
        return rank_varying_dims(self.global_shape(name), self.placeholder_layout(name), self.mesh)

    # ---- values ----------------------------------------------------------------------------
    def wrap_local(self, local: torch.Tensor, name: str, layout=None) -> DTensor:
        layout = layout if layout is not None else self.placeholder_layout(name)
        shape = self.global_shape(name)
        return DTensor.from_local(
            local,
            self.mesh,
            layout,
            run_check=False,
            shape=torch.Size(shape),
            stride=contiguous_stride(shape),
        )

    @staticmethod
    def _resolve(env: dict, node: fx.Node) -> Any:
        if node.op == "call_function" and node.target is operator.getitem:
            src, idx = node.args
            return env[src.name][idx]
        return env[node.name]

    def _to_layout(self, value: Any, layout) -> Any:
        if not isinstance(value, DTensor) or layout is None:
            return value
        cur = normalize_placements(value.placements, value.ndim)
        if cur == tuple(layout):
            return value
        to_partial = [
            d for d, (c, p) in enumerate(zip(cur, layout)) if p.is_partial() and not c.is_partial()
        ]
        if not to_partial:
            return value.redistribute(self.mesh, layout)
        # DTensor refuses to redistribute to Partial (internal only), but a plan may ask
        # for it (a replicated value entering a sum-reduced one): replicate those dims,
        # then partition locally. For a sum, one rank per group keeps the value and the
        # others hold zeros (exact, any dtype); avg / max / min keep it everywhere.
        staged = tuple(Replicate() if d in to_partial else p for d, p in enumerate(layout))
        if staged != cur:
            value = value.redistribute(self.mesh, staged)
        local = value.to_local()
        for d in to_partial:
            if getattr(layout[d], "reduce_op", "sum") == "sum":
                local = zero_unless_first(local, self.mesh, d)
        return DTensor.from_local(
            local,
            self.mesh,
            tuple(layout),
            run_check=False,
            shape=value.shape,
            stride=value.stride(),
        )

    def _redistributed(self, env: dict, ref: fx.Node, value: Any, strs, what: str) -> Any:
        """``value`` (node ``ref``'s) in layout ``strs``, redistributed once per pass: every
        later consumer wanting the same layout reuses it (and the backward reuses the
        forward's for the pairs in ``reused_across``)."""
        done = env.setdefault(REDISTRIBUTED, {})
        key = (ref.name, tuple(strs))
        if key not in done:
            done[key] = self._to_layout(value, self._layout(strs, what))
        return done[key]

    def _fix_device(self, v: Any) -> Any:
        """Every device the traced graph names is this rank's: the trace ran on one device
        (cuda:0 for a CUDA mesh, CPU without a GPU), so factory calls inside ``forward``
        (``torch.arange(..., device=x.device)``: rotary tables, masks) recorded that one,
        which is another rank's GPU on every rank but the first."""
        return self.device if isinstance(v, torch.device) else v

    def _wrap_plain(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor) and not isinstance(v, DTensor):
            return DTensor.from_local(
                v, self.mesh, (Replicate(),) * self.mesh.ndim, run_check=False
            )
        return v

    def run_node(self, env: dict, node: fx.Node) -> None:
        if node.target is operator.getitem:
            return  # folded: consumers index the producer's tuple
        entry = self.plan_nodes.get(node.name) or {}
        planned_inputs = entry.get("inputs")
        refs = tensor_refs(node.args, node.kwargs)
        if planned_inputs is not None and len(planned_inputs) != len(refs):
            raise ValueError(
                f"plan node {node.name} ({node.target}) lists "
                f"{len(planned_inputs)} input layouts but the node has "
                f"{len(refs)} tensor arguments"
            )
        # ops whose C++ rows are exact on local shards run there, in the plan's layouts,
        # whenever the plan names them all: DTensor's own propagation may pick another
        # output layout (convolution: batch splits only) or none at all
        local_per_plan = (
            planned_inputs is not None
            and runs_locally(node)
            and self._plan_names_outputs(node, entry)
        )

        def call(replicate_dims: frozenset = frozenset()):
            counter = iter(range(len(refs)))
            used: list = []

            def fetch(ref: fx.Node):
                k = next(counter)
                value = self._resolve(env, ref)
                if planned_inputs is not None and planned_inputs[k] is not None:
                    value = self._redistributed(
                        env, ref, value, planned_inputs[k], f"plan node {node.name} input {k}"
                    )
                elif replicate_dims and isinstance(value, DTensor):
                    value = self._to_layout(
                        value,
                        tuple(
                            Replicate() if d in replicate_dims else p
                            for d, p in enumerate(
                                normalize_placements(value.placements, value.ndim)
                            )
                        ),
                    )
                used.append(
                    layout_to_strs(normalize_placements(value.placements, value.ndim))
                    if isinstance(value, DTensor)
                    else None
                )
                return value

            args = fx.node.map_arg(node.args, fetch)
            kwargs = fx.node.map_arg(node.kwargs, fetch)
            args = tuple(self._fix_device(v) for v in args)
            kwargs = {k: self._fix_device(v) for k, v in kwargs.items()}
            if local_per_plan:
                out = self._run_local(node, entry, args, kwargs)
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                return out, [self._wrap_plain(o) for o in outs], used
            try:
                out = node.target(*args, **kwargs)
            except NotImplementedError as e:  # a RuntimeError: caught before the next clause
                if "sharding strategy" not in str(e) and "sharding propagation" not in str(e):
                    raise
                if planned_inputs is not None and runs_locally(node):
                    out = self._run_local(node, entry, args, kwargs)
                else:
                    out = self._run_replicated(node, args, kwargs)
            except (RuntimeError, ValueError):
                # The trace recorded a view of a tensor that was contiguous there (e.g.
                # `.transpose(1, 2).flatten(-2)` after an attention kernel whose output
                # strides make it so); here the local tensor may have other strides
                # (another kernel or device, a redistribution): a reshape gives the
                # same values. (Eager kernels raise RuntimeError, fake tensors - while the
                # program is lowered - ValueError.) A DTensor keeps the traced global strides,
                # so DTensor's reshape would take the same view: view a contiguous copy of the
                # local shard under contiguous global strides instead (e.g. a transpose of a
                # value an all-to-all left contiguous in the other dim order: MoE tokens).
                if node.target not in _VIEWS or not isinstance(args[0], torch.Tensor):
                    raise
                x = args[0]
                if isinstance(x, DTensor):
                    x = DTensor.from_local(
                        x.to_local().contiguous(),
                        x.device_mesh,
                        x.placements,
                        run_check=False,
                        shape=x.shape,
                        stride=contiguous_stride(x.shape),
                    )
                    out = node.target(x, *args[1:], **kwargs)
                elif x.is_contiguous():
                    raise
                else:
                    out = torch.ops.aten.reshape.default(*args, **kwargs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            return out, [self._wrap_plain(o) for o in outs], used

        out, outs, used_layouts = call()
        bad_dims = frozenset(
            d
            for o in outs
            if isinstance(o, DTensor)
            for d, p in enumerate(o.placements)
            if not _representable((p,))
        )
        if bad_dims and planned_inputs is None:
            # DTensor chose a layout plans cannot name (e.g. _StridedShard from a view):
            # replicate the inputs on those mesh dims and run again, so the recorded plan
            # stays exact and replayable
            self.warnings[f"unrepresentable:{node.target}"] += 1
            out, outs, used_layouts = call(bad_dims)
        done = []
        for k, o in enumerate(outs):
            if isinstance(o, DTensor):
                want = self.planned_output(node.name, k)
                got = normalize_placements(o.placements, o.ndim)
                if want is None and not _representable(got):
                    # e.g. _StridedShard from a view: plans cannot name it, so the value
                    # is replicated on that mesh dim to keep the recorded plan exact
                    want = tuple(p if _representable((p,)) else Replicate() for p in got)
                    self.warnings[f"unrepresentable:{node.target}"] += 1
                    o = o.redistribute(self.mesh, want)
                    got = want
                if want is not None and got != tuple(want):
                    msg = (
                        f"node {node.name} ({node.target}){_node_source(node)}: DTensor "
                        f"produced output {k} as {_safe_strs(got)} but the plan says "
                        f"{layout_to_strs(want)} (inputs {used_layouts})"
                    )
                    if self.strict:
                        raise PlanMismatchError(msg)
                    self.warnings[str(node.target)] += 1
                    log.debug("autoshard: %s; redistributing", msg)
                    # _to_layout: the plan may want a Partial (e.g. histc's per-shard
                    # counts), which DTensor.redistribute refuses to produce
                    o = self._to_layout(o, tuple(want))
            done.append(o)
        self.recorded[node.name] = {
            "inputs": used_layouts,
            "outputs": [
                (
                    layout_to_strs(normalize_placements(o.placements, o.ndim))
                    if isinstance(o, DTensor)
                    else None
                )
                for o in done
            ],
        }
        env[node.name] = tuple(done) if isinstance(out, (tuple, list)) else done[0]

    def _plan_names_outputs(self, node: fx.Node, entry: dict) -> bool:
        """Whether the plan gives a layout to every tensor output of ``node``."""
        vals = node.meta.get("val")
        vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
        outs = entry.get("outputs") or []
        return all(
            k < len(outs) and outs[k] is not None
            for k, v in enumerate(vals)
            if isinstance(v, torch.Tensor)
        )

    @property
    def balanced_ranks(self) -> int | None:
        """The context-parallel ranks of the head-tail order the step was traced in
        (trace/load_balance.py), or None: natural order."""
        order = getattr(self.step, "load_balance", None)
        return order.n if order is not None else None

    def _local_call_at_positions(self, node: fx.Node, op: str, args, kwargs, entry: dict, balanced):
        """An attention call on this rank's shards, by the positions they hold."""
        q_at = context_parallel.q_input(op)
        refs = tensor_refs(node.args, node.kwargs)
        seq = int(refs[q_at].meta["val"].shape[context_parallel.SEQ_DIM])
        q_start, k_start = context_parallel.shard_starts(
            op, entry.get("inputs") or (), self.mesh.shape, self.mesh._sym_get_coordinate, seq
        )
        return context_parallel.local_call_at_positions(
            op, args, kwargs, seq, balanced, q_start, k_start, local_impl(node.target),
            self.block_masks,
        )  # fmt: skip

    def _run_local(self, node: fx.Node, entry: dict, args, kwargs):
        """No DTensor rule, but the op needs no global sizes: run it on the local shards the
        plan's input layouts give (C++ rules guarantee those rows are exact) and wrap the
        results in the plan's output layouts."""
        import torch.utils._pytree as pytree

        self.warnings[f"local:{node.target}"] += 1
        # ATen kernels take any strides; other ops (a user's custom op) get contiguous shards
        aten_op = getattr(node.target, "namespace", None) == "aten"
        local = lambda v: (
            (v.to_local() if aten_op else v.to_local().contiguous())
            if isinstance(v, DTensor)
            else v
        )
        args, kwargs = pytree.tree_map(local, args), pytree.tree_map(local, kwargs)
        vals = node.meta.get("val")
        vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
        size_arg = OUTPUT_SIZE_ARGS.get(str(node.target))
        if size_arg is not None:
            # a size argument that is an output's global shape: that output's local shape
            # (meta/fake kernels shape the output from it, e.g. convolution_backward's
            # bias_sizes, so the lowered program would get a global-sized grad_bias)
            arg_at, out_k = size_arg
            layout = self.planned_output(node.name, out_k)
            if (
                arg_at < len(args)
                and args[arg_at] is not None
                and layout is not None
                and out_k < len(vals)
                and isinstance(vals[out_k], torch.Tensor)
            ):
                args = list(args)
                args[arg_at] = rank_local_shape(tuple(vals[out_k].shape), layout, self.mesh)
        op = str(node.target)
        balanced = self.balanced_ranks
        if context_parallel.needs_local_call(op, args, entry.get("inputs"), balanced):
            # attention on this rank's query positions (a block of a sharded sequence, or
            # the head-tail order): block kernels, or FlexAttention's mods at those
            # positions (ops/context_parallel.py)
            out = self._local_call_at_positions(node, op, args, kwargs, entry, balanced)
        elif varlen_attention.needs_local_offsets(op, entry.get("inputs")):
            # varlen attention on a block of the packed tokens: the block's documents
            tokens = int(tensor_refs(node.args, node.kwargs)[0].meta["val"].shape[0])
            out = varlen_attention.call_on_token_block(
                op, args, kwargs, entry["inputs"], self.mesh.shape,
                self.mesh._sym_get_coordinate, tokens, local_impl(node.target),
            )  # fmt: skip
        else:
            out = local_impl(node.target)(*args, **kwargs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        wrapped = []
        for k, o in enumerate(outs):
            layout = self.planned_output(node.name, k)
            if (
                isinstance(o, torch.Tensor)
                and layout is not None
                and k < len(vals)
                and isinstance(vals[k], torch.Tensor)
            ):
                # the traced value's global shape and stride: later views depend on them,
                # so the local result is laid out in the traced memory order too (the CPU
                # flash-attention kernel and its meta function disagree on it)
                o = _match_stride_order(o, vals[k])
                o = DTensor.from_local(
                    o,
                    self.mesh,
                    layout,
                    run_check=False,
                    shape=vals[k].shape,
                    stride=tuple(vals[k].stride()),
                )
            wrapped.append(o)
        return tuple(wrapped) if isinstance(out, (tuple, list)) else wrapped[0]

    def _run_replicated(self, node: fx.Node, args, kwargs):
        """No DTensor rule for this op: run it on full (replicated) values, exactly."""
        self.warnings[f"replicated:{node.target}"] += 1
        full = lambda v: (
            v.redistribute(self.mesh, (Replicate(),) * self.mesh.ndim).to_local()
            if isinstance(v, DTensor)
            else v
        )
        import torch.utils._pytree as pytree

        out = node.target(*pytree.tree_map(full, args), **pytree.tree_map(full, kwargs))
        return out

    # ---- the two passes ---------------------------------------------------------------------
    def run_forward(
        self,
        param_locals: Sequence[torch.Tensor],
        buffer_locals: Sequence[torch.Tensor],
        input_values: Sequence[Any],
    ) -> tuple[list, dict, list]:
        env: dict[str, Any] = {}
        given: dict[str, torch.Tensor] = {}  # the tensors passed in, by placeholder
        for name, t in zip(self.param_names, param_locals):
            env[name] = self.wrap_local(t, name)
        for name, t in zip(self.buffer_names, buffer_locals):
            env[name], given[name] = self.wrap_local(t, name), t
        for name, v in zip(self.step.input_nodes, input_values):
            if name is not None:
                env[name] = self.wrap_local(v, name) if isinstance(v, torch.Tensor) else v
                given[name] = v
        for name in self.constants:
            full = DTensor.from_local(
                self._constant_on_device(name),
                self.mesh,
                (Replicate(),) * self.mesh.ndim,
                run_check=False,
            )
            env[name] = self._to_layout(full, self.placeholder_layout(name))
        for node in self.forward_nodes:
            self.run_node(env, node)
        outs, layouts = [], []
        for o in self.fwd_outputs:
            value = self._resolve(env, o.node)
            if isinstance(value, DTensor):
                graph_out = self.plan_graph_output(o)
                if graph_out is not None:
                    value = self._to_layout(value, graph_out)
                placements = normalize_placements(value.placements, value.ndim)
                if any(p.is_partial() for p in placements):  # users get real values
                    placements = tuple(Replicate() if p.is_partial() else p for p in placements)
                    value = value.redistribute(self.mesh, placements)
                layouts.append(placements)
                self.recorded_output_layouts[o.output_index] = placements
                outs.append(value.to_local())
            else:
                layouts.append(None)
                outs.append(value)
        saved = {k: env[k] for k in self.saved_names if k in env}
        done = env.get(REDISTRIBUTED, {})
        saved[REDISTRIBUTED] = {k: done[k] for k in sorted(self.reused_across) if k in done}
        if self.written:
            saved = self._write_back(env, saved, given)
        return outs, saved, layouts

    def _constant_on_device(self, name: str) -> torch.Tensor:
        """Tensor constant ``name`` on this runner's device, copied there once: a copy made
        per step would cross from the host every step (and a program traced with one
        would keep it as a copy node). Made outside any trace, so that a lowered program
        holds the device tensor itself as its constant."""
        value = self.constants[name]
        if value.device == self.device or not _device_present(self.device):
            # nothing to copy, or (a program lowered for a device this host lacks) nothing
            # that could be copied for real: traced as it is
            return value.to(self.device)
        key = (name, self.device)
        if key not in self._device_constants:
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes(), torch.no_grad():
                self._device_constants[key] = value.to(self.device)
        return self._device_constants[key]

    def _write_back(self, env: dict, saved: dict, given: dict) -> dict:
        """forward() wrote buffers or inputs in place: their new values go into the tensors
        passed in (this rank's shards), redistributed to the input's own layout. What the
        backward reads and shares storage with a written tensor is copied first: it holds
        the value from before the write."""
        from torch.multiprocessing.reductions import StorageWeakRef

        targets = [(given[o.grad_of], o) for o in self.written if o.grad_of in given]
        storages = {StorageWeakRef(t.untyped_storage()) for t, _ in targets}

        def before_write(v):
            local = v._local_tensor if isinstance(v, DTensor) else v
            if (
                isinstance(local, torch.Tensor)
                and StorageWeakRef(local.untyped_storage()) in storages
            ):
                return v.clone()
            return v

        saved = pytree.tree_map(before_write, saved)
        for t, o in targets:
            new = self._to_layout(self._resolve(env, o.node), self.placeholder_layout(o.grad_of))
            t.copy_(new.to_local() if isinstance(new, DTensor) else new)
        return saved

    def plan_graph_output(self, out) -> Any:
        """The plan's layout for a graph output (``graph_outputs``, in graph JSON order)."""
        if self.graph_output_layouts is None:
            return None
        k = self.graph_output_order.index(id(out))
        strs = self.graph_output_layouts[k] if k < len(self.graph_output_layouts) else None
        return None if strs is None else self._layout(strs, f"plan graph output {k}")

    def run_backward(self, saved: dict, out_layouts: list, grads: Sequence[Any]) -> dict:
        env = dict(saved)
        env[REDISTRIBUTED] = dict(saved.get(REDISTRIBUTED, {}))
        for idx, o in enumerate(self.fwd_outputs):
            name = self.tangent_by_output.get(o.output_index)
            if name is None:
                continue
            g = grads[idx]
            if g is None:
                shape = self.global_shape(name)
                g = torch.zeros(
                    rank_local_shape(shape, out_layouts[idx], self.mesh),
                    dtype=self.placeholders[name].meta["val"].dtype,
                    device=self.device,
                )
            dt = self.wrap_local(g.contiguous(), name, out_layouts[idx])
            want = self.planned_output(name)
            env[name] = self._to_layout(dt, want)
            self.recorded_tangents[name] = layout_to_strs(
                normalize_placements(env[name].placements, env[name].ndim)
            )
        for node in self.backward_nodes:
            self.run_node(env, node)
        result: dict[str, torch.Tensor] = {}
        for ph, o in self.grad_outputs.items():
            value = self._resolve(env, o.node)
            if value is None:
                continue
            value = self._to_layout(value, self.placeholder_layout(ph))
            result[ph] = value.to_local().contiguous()
        return result

    def recorded_plan(self) -> dict:
        """The complete plan this runner executed (after at least one forward+backward)."""
        nodes = {}
        for name in self.placeholders:
            if name in self.step.tangent_of:
                continue
            nodes[name] = {"outputs": [layout_to_strs(self.placeholder_layout(name))]}
        for name in self.step.tangent_of:
            if name in self.recorded_tangents:
                nodes[name] = {"outputs": [self.recorded_tangents[name]]}
        nodes.update(self.recorded)
        graph_outputs = []
        for o in self.step.outputs:
            if not isinstance(o.node, fx.Node):
                continue
            if o.role == "grad":
                graph_outputs.append(layout_to_strs(self.placeholder_layout(o.grad_of)))
            else:
                layout = self.recorded_output_layouts.get(o.output_index)
                graph_outputs.append(None if layout is None else layout_to_strs(layout))
        return {
            "version": 1,
            "mesh": {
                "shape": list(self.mesh.shape),
                "dim_names": list(self.mesh.mesh_dim_names or []),
            },
            "nodes": nodes,
            "graph_outputs": graph_outputs,
        }


def _match_stride_order(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``t`` with its dims laid out in memory in the same order as ``ref``'s."""
    if t.dim() != ref.dim() or t.dim() < 2:
        return t
    # outermost first: larger stride, ties broken by the later dim being inner
    order = sorted(range(ref.dim()), key=lambda d: (-ref.stride(d), d))
    if order == sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)):
        return t
    inverse = [order.index(d) for d in range(t.dim())]
    return t.permute(order).contiguous().permute(inverse)


def _safe_strs(placements) -> list[str]:
    return [layout_to_strs((p,))[0] if _representable((p,)) else repr(p) for p in placements]


def _representable(placements) -> bool:
    from torch.distributed.tensor import Partial, Shard

    return all(type(p) in (Shard, Replicate, Partial) for p in placements)


def _device_present(device: torch.device) -> bool:
    """Whether real tensors can be made on ``device`` on this host."""
    if device.type in ("cpu", "meta"):
        return True
    module = getattr(torch, device.type, None)
    if module is None or not module.is_available():
        return False
    return (device.index or 0) < module.device_count()


def _mesh_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def mark_integer_outputs(ctx, outs) -> None:
    """Integer tensors a step returns carry no gradient: autograd must not ask for one."""
    for o in outs:
        if isinstance(o, torch.Tensor) and not o.is_floating_point():
            ctx.mark_non_differentiable(o)


class _StepFunction(torch.autograd.Function):
    """One training step as one autograd node: inputs are the LOCAL shards of the parameters
    (from ``DTensor.to_local``, so gradients flow back into DTensor ``.grad``), buffers and
    user inputs; outputs are the local forward outputs."""

    @staticmethod
    def forward(ctx, runner: StepRunner, n_params: int, n_buffers: int, *flat):
        params = flat[:n_params]
        buffers = flat[n_params : n_params + n_buffers]
        inputs = flat[n_params + n_buffers :]
        outs, saved, layouts = runner.run_forward(params, buffers, inputs)
        # saved tensors go through save_for_backward so that autograd owns them: it frees
        # them after backward, raises its usual "backward through the graph a second time"
        # error on a second backward, and keeps them for retain_graph=True
        leaves, spec = pytree.tree_flatten(saved)
        is_tensor = [isinstance(v, torch.Tensor) for v in leaves]
        ctx.save_for_backward(*(v for v, t in zip(leaves, is_tensor) if t))
        ctx.saved_consts = [(t, None if t else v) for v, t in zip(leaves, is_tensor)]
        ctx.saved_spec = spec
        ctx.runner, ctx.layouts = runner, layouts
        ctx.n_params, ctx.n_buffers, ctx.n_inputs = n_params, n_buffers, len(inputs)
        mark_integer_outputs(ctx, outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        runner: StepRunner = ctx.runner
        tensors = iter(ctx.saved_tensors)
        leaves = [next(tensors) if t else v for t, v in ctx.saved_consts]
        saved = pytree.tree_unflatten(leaves, ctx.saved_spec)
        result = runner.run_backward(saved, ctx.layouts, grads)
        param_grads = [result.get(n) for n in runner.param_names]
        input_grads = [result.get(n) if n is not None else None for n in runner.step.input_nodes]
        return (None, None, None, *param_grads, *([None] * ctx.n_buffers), *input_grads)
