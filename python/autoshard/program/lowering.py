"""Lowering a plan to a per-rank program: two FX graphs on LOCAL shards.

The reference runtime (runtime.StepRunner) interprets the joint graph node by node as
DTensor ops. Here that interpreter is traced ONCE with ``make_fx`` under a fake tensor mode:
DTensor's dispatch turns every op into its local ATen op (size arguments localised, uneven
shards padded and unpadded) and every redistribution into explicit functional collectives
(``_c10d_functional.all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_reduce`` /
``all_to_all_single``, each followed by ``wait_tensor``). What is recorded is plain ATen on
plain tensors, so running it needs no DTensor dispatch and no per-node interpreter, and
inductor can compile it.

Two graphs, split where the runner splits (nodes that read a tangent are backward):
  forward : (param locals, buffer locals, tensor inputs) -> (outputs, saved tensors)
  backward: (saved tensors, output gradients)            -> (param grads, input grads)
Saved tensors cross as local tensors; the DTensor metadata they need to be re-wrapped in the
backward trace (placements, global shape and stride) is recorded here and only used while
tracing. After tracing, overlap.schedule_collectives moves every collective to where its
input is ready and every wait to just before the first use of its result.

Each collective node carries ``meta["custom"]["autoshard_node"]``: the joint-graph node whose
input redistribution issued it, or "<graph outputs>" for the loss and the gradients leaving
in their parameters' layouts (tests compare these with the plan's redistributions).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor

from autoshard.program.interpreter import StepRunner, contiguous_stride, mark_integer_outputs
from autoshard.program.graph_nodes import (
    OUTSIDE,
    PARAM_KEY,
    is_collective,
    is_wait,
    op_name,
    strip_views,
)
from autoshard.program.passes.deferred_tail import DeferredValue, PendingTail
from autoshard.program.passes.deferred_tail import defers_round_trips, split_forward
from autoshard.program.passes.direct_calls import bind_direct_calls
from autoshard.program.passes.fuse_reductions import (
    coalesce_small_reductions,
    count_targets_early,
    split_normalised_reductions,
)
from autoshard.program.passes.in_place import divide_in_place, reduce_in_place
from autoshard.program.passes.late_loss_scale import scale_gradients_late
from autoshard.program.passes.overlap import bucket_gathers, bucket_reductions, schedule_collectives
from autoshard.program.passes.simplify import simplify
from autoshard.program.passes.uneven import UnevenDims


@dataclass
class _SavedSpec:
    """How to turn a saved local tensor back into the value the backward nodes read."""

    placements: tuple | None  # None: a plain tensor (not a DTensor)
    shape: torch.Size | None = None
    stride: tuple | None = None


@dataclass
class LocalProgram:
    """One rank's step: ``forward`` then ``backward`` graphs on local tensors."""

    fwd_gm: fx.GraphModule
    bwd_gm: fx.GraphModule
    n_outputs: int  # tensor outputs of the module (the rest of fwd's are saved)
    output_slots: list  # per module output: index into tensor outputs, or ("const", v)
    input_tensor_positions: list[int]  # which flat inputs (params, buffers, inputs) are tensors
    fwd: Callable = None  # what runs: fwd_gm or its compiled form
    bwd: Callable = None
    compiled: bool = False
    info: dict = field(default_factory=dict)
    state_key: tuple = ()  # apply._state_key of the state it was lowered for
    random_states_checked: bool = False  # rng_check: ranks' generators compared once
    split: Any = None  # deferred_tail.SplitForward of fwd, for the training step
    pending: Any = None  # the last training forward's PendingTail
    # the graphs fwd / bwd run (fwd_gm / bwd_gm rewritten for the step: lower_step), before
    # any compilation
    run_fwd_gm: fx.GraphModule = None
    run_bwd_gm: fx.GraphModule = None

    def __post_init__(self):
        self.fwd = self.fwd or self.fwd_gm
        self.bwd = self.bwd or self.bwd_gm

    def collectives(self) -> list[dict]:
        """Every collective the step runs: phase, kind, joint-graph node that issued it."""
        out = []
        for phase, gm in (
            ("forward", self.run_fwd_gm or self.fwd_gm),
            ("backward", self.run_bwd_gm or self.bwd_gm),
        ):
            for n in gm.graph.nodes:
                if is_collective(n):
                    custom = n.meta.get("custom") or {}
                    src = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
                    where = custom.get("autoshard_node", OUTSIDE)
                    out.append(
                        {
                            "phase": phase,
                            "op": op_name(n).rstrip("_"),
                            "where": where,
                            # the joint-graph nodes of the collectives a fused one replaced
                            "members": custom.get("autoshard_members") or [where],
                            "numel": int(src.numel()) if src is not None else -1,
                            "node": n.name,
                        }
                    )
        return out


def _fake_like(mode, t: torch.Tensor, symbolic_dims: Sequence[int] = ()) -> torch.Tensor:
    """A fake copy of ``t``, with a size symbol (hinted by ``t``'s size) for each of
    ``symbolic_dims``, static otherwise."""
    if not symbolic_dims:
        return mode.from_tensor(t, static_shapes=True)
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    context = StatelessSymbolicContext(
        dynamic_sizes=[
            DimDynamic.DYNAMIC if d in symbolic_dims else DimDynamic.STATIC for d in range(t.dim())
        ]
    )
    return mode.from_tensor(t, symbolic_context=context)


def _fake_gradient(mode, out: torch.Tensor) -> torch.Tensor:
    """An example gradient of forward output ``out``: contiguous, on its device, a fake
    tensor of ``mode``. Made from a meta tensor: a real one would be allocated on the rank's
    GPU just to be copied (and cannot be made where the device is only emulated)."""
    meta = torch.empty_strided(
        tuple(out.shape), contiguous_stride(out.shape), dtype=out.dtype, device="meta"
    )
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, out.device)


@contextlib.contextmanager
def _annotating_nodes(runner: StepRunner):
    """While tracing, tag every recorded op with the joint-graph node being run."""
    import torch.fx.traceback as fx_traceback

    original = runner.run_node

    def run_node(env, node):
        with fx_traceback.annotate({"autoshard_node": node.name}):
            return original(env, node)

    runner.run_node = run_node
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        del runner.run_node


def lower_step(
    runner: StepRunner,
    param_locals: list[torch.Tensor],
    buffer_locals: list[torch.Tensor],
    input_values: list[Any],
    *,
    overlap: bool = True,
    prefetch_bytes: int | None = None,
    bucket_bytes: int | None = None,
    reduce_inplace: bool = True,
    dynamic: bool = False,
) -> LocalProgram:
    """Trace ``runner``'s forward and backward into local graphs. The example tensors give
    local shapes and dtypes only (they are replaced by fake tensors; nothing runs).
    ``reduce_inplace`` (eager): fresh buffers are all-reduced in place (reduce_in_place) and
    common ops called through their Python bindings (direct_calls); off when inductor
    compiles the program (it wants functional ATen graphs and re-places them itself)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    n_params, n_buffers = len(param_locals), len(buffer_locals)
    flat = list(param_locals) + list(buffer_locals) + list(input_values)
    tensor_pos = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    import torch.distributed.config as dist_config
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # torch's compile_on_one_rank: DTensor takes mesh coordinates from a runtime op
    # (device_mesh._runtime_compute_coordinate_on_dim) when the fake mode has a shape env, so
    # the program is every rank's, not this one's. Dims sharded unevenly (their size differs
    # by rank) are then symbolic, and so are they with dynamic=True, as AutoParallel's: DTensor
    # pads and unpads them by sizes computed at run time
    one_rank = bool(dist_config.compile_on_one_rank)
    shape_env = ShapeEnv() if one_rank or dynamic else None
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env)
    names = [*runner.param_names, *runner.buffer_names, *runner.step.input_nodes]
    uneven = UnevenDims(runner, names, tensor_pos, symbolic=shape_env is not None)
    fake_flat = [_fake_like(mode, flat[i], uneven.dims[i]) for i in tensor_pos]
    uneven_symbols = uneven.size_symbols(dict(zip(tensor_pos, fake_flat)))
    # symbolic: ops decompose through the Python dispatcher, which keeps sizes symbolic
    tracing = "symbolic" if uneven else "fake"

    def rebuild(tensors):
        full = list(flat)
        for i, t in zip(tensor_pos, tensors):
            full[i] = t
        return full

    meta: dict = {}

    def forward(*tensors):
        full = rebuild(tensors)
        with torch.no_grad():
            outs, saved, layouts = runner.run_forward(
                full[:n_params], full[n_params : n_params + n_buffers], full[n_params + n_buffers :]
            )
        leaves, spec = pytree.tree_flatten(saved)
        saved_tensors, saved_specs, saved_consts = [], [], []
        for leaf in leaves:
            if isinstance(leaf, DTensor):
                saved_specs.append(_SavedSpec(tuple(leaf.placements), leaf.shape, leaf.stride()))
                saved_tensors.append(leaf.to_local())
                saved_consts.append(None)
            elif isinstance(leaf, torch.Tensor):
                saved_specs.append(_SavedSpec(None))
                saved_tensors.append(leaf)
                saved_consts.append(None)
            else:
                saved_specs.append(None)
                saved_consts.append(leaf)
        tensor_outs = [o for o in outs if isinstance(o, torch.Tensor)]
        meta.update(
            saved_spec=spec,
            saved_specs=saved_specs,
            saved_consts=saved_consts,
            layouts=layouts,
            n_outputs=len(tensor_outs),
            output_slots=_output_slots(outs),
        )
        return (*tensor_outs, *saved_tensors)

    with _annotating_nodes(runner), uneven.refusing_untraceable_collectives(one_rank):
        fwd_gm = make_fx(forward, tracing_mode=tracing, _allow_non_fake_inputs=True)(*fake_flat)
    n_out = meta["n_outputs"]
    out_vals = [n.meta["val"] for n in _graph_outputs(fwd_gm)]
    fake_outs, fake_saved = out_vals[:n_out], out_vals[n_out:]
    grad_examples = [_fake_gradient(mode, v) for v in fake_outs]
    n_saved = len(fake_saved)

    def backward(*tensors):
        saved_locals, grads = tensors[:n_saved], tensors[n_saved:]
        it = iter(saved_locals)
        leaves = []
        for spec, const in zip(meta["saved_specs"], meta["saved_consts"]):
            if spec is None:
                leaves.append(const)
            elif spec.placements is None:
                leaves.append(next(it))
            else:
                leaves.append(
                    DTensor.from_local(
                        next(it),
                        runner.mesh,
                        spec.placements,
                        run_check=False,
                        shape=spec.shape,
                        stride=spec.stride,
                    )
                )
        saved = pytree.tree_unflatten(leaves, meta["saved_spec"])
        # the runner expects one gradient per module output (None for non-tensors)
        all_grads, g = [], iter(grads)
        for slot in meta["output_slots"]:
            all_grads.append(next(g) if not isinstance(slot, tuple) else None)
        with torch.no_grad():
            result = runner.run_backward(saved, meta["layouts"], all_grads)
        wanted = list(runner.param_names) + [None] * n_buffers + list(runner.step.input_nodes)
        grads_out = []
        for i in tensor_pos:
            name = wanted[i]
            grads_out.append(result.get(name) if name is not None else None)
        return tuple(grads_out)

    with _annotating_nodes(runner), uneven.refusing_untraceable_collectives(one_rank):
        bwd_gm = make_fx(backward, tracing_mode=tracing, _allow_non_fake_inputs=True)(
            *fake_saved, *grad_examples
        )
    if one_rank and uneven:
        uneven.check_every_rank(uneven_symbols, shape_env)
    info = {"saved_tensors": n_saved}
    for gm in (fwd_gm, bwd_gm):
        _tidy(gm)
    _mark_parameters(fwd_gm, bwd_gm, [runner.step.param_fqns[n] for n in runner.param_names], n_out)
    if overlap:
        info["early_target_counts"] = count_targets_early(fwd_gm)
        info["split_normalised_reductions"] = sum(
            split_normalised_reductions(gm) for gm in (fwd_gm, bwd_gm)
        )
        info["forward_gather_buckets"] = bucket_gathers(fwd_gm, bucket_bytes)
        info["backward_gather_buckets"] = bucket_gathers(bwd_gm, bucket_bytes)
        # backward output k is the gradient of flat input tensor_pos[k]: params come first
        grad_of = [
            runner.step.param_fqns[runner.param_names[i]] if i < n_params else None
            for i in tensor_pos
        ]
        info["backward_reduction_buckets"] = bucket_reductions(bwd_gm, bucket_bytes, grad_of)
        info["coalesced_small_reductions"] = sum(
            coalesce_small_reductions(gm) for gm in (fwd_gm, bwd_gm)
        )
        info["forward_schedule"] = schedule_collectives(fwd_gm, prefetch_bytes)
        info["backward_schedule"] = schedule_collectives(bwd_gm, prefetch_bytes)
        for gm in (fwd_gm, bwd_gm):
            _tidy(gm)  # the buckets' flattening adds views of 1-D shards
    for gm in (fwd_gm, bwd_gm):
        _label_outside_nodes(gm)
    program = LocalProgram(fwd_gm, bwd_gm, n_out, meta["output_slots"], tensor_pos, info=info)
    # what runs: copies of the graphs, rewritten for the eager (or inductor-compiled) step;
    # fwd_gm / bwd_gm stay as traced and scheduled (parallel_gm, torch.compile of the
    # module, which traces them under Dynamo)

    program.fwd, program.bwd = _copy_gm(fwd_gm), _copy_gm(bwd_gm)
    # only where waits block the host (gloo), not on NCCL (deferred_tail.defers_round_trips)
    defer = defers_round_trips(runner.mesh)
    info["deferred_round_trips"] = int(defer)
    # the count of targets (all-reduced early so the backward's start need not wait) and
    # the loss sum in one all-reduce when the backward divides by the count at its end
    # instead: one round trip a step instead of two, and the forward waits for neither
    together = _copy_gm(program.fwd)
    if not defer:
        info["late_loss_scale"] = 0
    elif coalesce_small_reductions(together, hold_back=True) and scale_gradients_late(
        together, program.bwd, n_out
    ):
        program.fwd, info["late_loss_scale"] = together, 1
        info["loss_reductions_held_back"] = 1
    else:
        info["late_loss_scale"] = scale_gradients_late(program.fwd, program.bwd, n_out)
    if reduce_inplace:  # eager: in-place reductions, common ops through their Python bindings
        info["all_reduces_in_place"] = sum(reduce_in_place(gm) for gm in (program.fwd, program.bwd))
        info["divisions_in_place"] = divide_in_place(program.bwd)
        info["direct_calls"] = sum(bind_direct_calls(gm) for gm in (program.fwd, program.bwd))
    program.run_fwd_gm, program.run_bwd_gm = program.fwd, program.bwd
    program.split = split_forward(program.fwd, n_out) if defer else None
    info["deferred_forward_outputs"] = len(program.split.from_tail) if program.split else 0
    if all(flat[i].device == runner.device for i in tensor_pos):
        # a program for the materialised state (not one lowered from meta shards to be
        # inspected): it must name this rank's device only
        check_program_devices(program, runner.device)
    return program


def foreign_devices(gm: fx.GraphModule, device: torch.device) -> list[str]:
    """Where graph ``gm`` names a device other than ``device``: device arguments of its
    calls and the devices of the tensors its nodes hold (``meta["val"]``) and its constants
    (get_attr), one line per place ("node: cuda:0"). A CPU scalar (a 0-dim tensor) is not
    counted: torch lets it meet tensors of any device. A rank's program must name only that
    rank's device: another GPU's index there allocates on (or fails against) that GPU."""
    device = torch.device(device)
    found: list[str] = []

    def visit(where: str, value: Any) -> None:
        for leaf in pytree.tree_leaves(value):
            if isinstance(leaf, torch.device):
                d = leaf
            elif isinstance(leaf, torch.Tensor) and not (leaf.dim() == 0 and leaf.is_cpu):
                d = leaf.device
            else:
                continue
            if d != device:
                found.append(f"{where}: {d}")

    for n in gm.graph.nodes:
        visit(f"{n.name} ({n.target}) argument", (n.args, n.kwargs))
        visit(f"{n.name} value", n.meta.get("val"))
        if n.op == "get_attr":
            visit(f"{n.name} constant", getattr(gm, n.target, None))
    return found


def check_program_devices(program: LocalProgram, device: torch.device) -> None:
    """Raises RuntimeError naming every place where ``program``'s graphs (as traced and as
    they run) name a device other than ``device``, the rank's own."""
    graphs = {
        "forward": program.fwd_gm,
        "backward": program.bwd_gm,
        "forward as run": program.run_fwd_gm,
        "backward as run": program.run_bwd_gm,
    }
    problems = [
        f"{name} graph, {place}"
        for name, gm in graphs.items()
        if gm is not None
        for place in foreign_devices(gm, device)
    ]
    if problems:
        raise RuntimeError(
            f"autoshard: this rank's program (device {device}) names other devices; it would "
            f"allocate on, or fail against, another rank's device. This is a bug in "
            f"autoshard's lowering: please report it with these places: "
            + "; ".join(problems[:10])
            + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        )


def _copy_gm(gm: fx.GraphModule) -> fx.GraphModule:
    g = fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, g)


def _mark_parameters(
    fwd_gm: fx.GraphModule, bwd_gm: fx.GraphModule, fqns: list[str], n_outputs: int
) -> None:
    """Name the parameter behind each placeholder: the forward's first inputs are the
    parameters' shards; a backward input is one when the forward saved that shard as is.
    The overlap pass buckets parameter gathers per block with these names."""
    fwd_inputs = [n for n in fwd_gm.graph.nodes if n.op == "placeholder"]
    for node, fqn in zip(fwd_inputs, fqns):
        node.meta[PARAM_KEY] = fqn
    saved = _graph_outputs(fwd_gm)[n_outputs:]
    bwd_inputs = [n for n in bwd_gm.graph.nodes if n.op == "placeholder"]
    for src, node in zip(saved, bwd_inputs):
        fqn = strip_views(src).meta.get(PARAM_KEY) if isinstance(src, fx.Node) else None
        if fqn is not None:
            node.meta[PARAM_KEY] = fqn


def _tidy(gm: fx.GraphModule) -> None:

    simplify(gm)


def _output_slots(outs: list) -> list:
    slots, k = [], 0
    for o in outs:
        if isinstance(o, torch.Tensor):
            slots.append(k)
            k += 1
        else:
            slots.append(("const", o))
    return slots


def _label_outside_nodes(gm: fx.GraphModule) -> None:
    """Ops that no joint-graph node ran (the graph outputs' redistribution, after the last
    node) name ``OUTSIDE`` in ``meta["custom"]``, as every other op names its node: only
    waits carry no name (AutoParallel's parallel_gm leaves its collectives' waits bare)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.meta.get("custom") is None and not is_wait(n):
            n.meta["custom"] = {"autoshard_node": OUTSIDE}


def joint_graph(program: LocalProgram) -> fx.GraphModule:
    """The step as one forward + backward graph, as AutoParallel's ``parallel_gm``: the
    forward's placeholders (``primals_k``), then one ``tangents_k`` per module output; the
    forward's nodes, then the backward's (tagged ``meta["partitioner_tag"] =
    "is_backward"``, reading the forward's saved values directly); outputs: the module
    outputs, then the gradients (None where an input has none). A step with no gradient
    at all (nothing requires grad) is its forward alone, without tangents. A view of the
    two graphs the module runs (``fwd_gm`` / ``bwd_gm``), for inspection; built anew on
    each call."""
    g = fx.Graph()
    env: dict[fx.Node, Any] = {}
    fwd_nodes = [n for n in program.fwd_gm.graph.nodes if n.op != "output"]
    fwd_outs = _graph_outputs(program.fwd_gm)
    grads = _graph_outputs(program.bwd_gm)
    backward = any(isinstance(o, fx.Node) for o in grads)
    bwd_inputs = (
        [n for n in program.bwd_gm.graph.nodes if n.op == "placeholder"] if backward else []
    )
    n_saved = len(fwd_outs) - program.n_outputs
    # placeholders named as in AOTAutograd's joint graph (primals_k, tangents_k)
    for k, n in enumerate(n for n in fwd_nodes if n.op == "placeholder"):
        env[n] = g.placeholder(f"primals_{k + 1}")
        env[n].meta = dict(n.meta)
    for k, ph in enumerate(bwd_inputs[n_saved:]):
        env[ph] = g.placeholder(f"tangents_{k + 1}")
        env[ph].meta = {key: v for key, v in ph.meta.items() if key != "custom"}
    for n in (n for n in fwd_nodes if n.op != "placeholder"):
        env[n] = g.node_copy(n, lambda a: env[a])
    for ph, saved in zip(bwd_inputs[:n_saved], fwd_outs[program.n_outputs :]):
        env[ph] = env[saved] if isinstance(saved, fx.Node) else saved
    for n in program.bwd_gm.graph.nodes if backward else ():
        if n.op in ("placeholder", "output"):
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
        env[n].meta["partitioner_tag"] = "is_backward"
    outs = fwd_outs[: program.n_outputs] + (grads if backward else [])
    g.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outs))
    # constants (get_attr) of both graphs on one root, under names unique in it
    root = torch.nn.Module()
    for gm in (program.fwd_gm, program.bwd_gm) if backward else (program.fwd_gm,):
        for n in (n for n in gm.graph.nodes if n.op == "get_attr"):
            name = n.target.replace(".", "_")
            while hasattr(root, name):
                name += "_"
            setattr(root, name, functools.reduce(getattr, n.target.split("."), gm))
            env[n].target = name
    return fx.GraphModule(root, g)


def _graph_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    args = out.args[0]
    return list(args) if isinstance(args, (tuple, list)) else [args]


def compile_program(program: LocalProgram) -> LocalProgram:
    """Compile both graphs with inductor (CPU or GPU); the FX graphs stay for inspection.
    Static shapes: a step's local shapes are fixed by the plan."""
    # inductor orders nodes by their inputs alone and would wait for a collective as soon as
    # it could (the backward would start by waiting for the loss normaliser it divides by
    # at its end): waits go just before their first use, as in the program's schedule.
    # (Not raise_comms: it would issue every parameter gather at the top, without the
    # schedule's bound on prefetched bytes.)
    overlap = {
        "reorder_for_compute_comm_overlap": True,
        "reorder_for_compute_comm_overlap_passes": ["sink_waits"],
    }

    def compiled(gm):
        return torch.compile(gm, backend="inductor", fullgraph=True, dynamic=False, options=overlap)

    # compiled on first call: the training step runs split.main (when the forward has a
    # deferred tail; the tail's few scalar ops stay eager), the no-grad step fwd
    program.fwd, program.bwd = compiled(program.fwd), compiled(program.bwd)
    if program.split is not None:
        program.split.main = compiled(program.split.main)
    program.compiled = True
    return program


class ProgramFunction(torch.autograd.Function):
    """The step as one autograd node running the lowered program. Inputs: the parameters
    (the first ``n_dtensors`` as DTensors, or all as local shards), the buffers' local
    shards and the user's tensor inputs; outputs are the local module outputs. The program
    runs on the parameters' local shards; the gradients of DTensor inputs (already in the
    parameters' layouts) go back as DTensors with the parameters' specs."""

    @staticmethod
    def forward(ctx, program: LocalProgram, n_dtensors: int, *tensors):
        params = tensors[:n_dtensors]
        local = [p._local_tensor for p in params]
        ctx.pending = None
        if program.split is not None and not torch.compiler.is_compiling():
            results = _run_split_forward(ctx, program, [*local, *tensors[n_dtensors:]])
        else:
            results = _runnable(program, "fwd")(*local, *tensors[n_dtensors:])
        outs, saved = results[: program.n_outputs], results[program.n_outputs :]
        ctx.program = program
        ctx.param_specs = [p._spec for p in params]
        ctx.save_for_backward(*saved)
        mark_integer_outputs(ctx, outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        program: LocalProgram = ctx.program
        grads = [g.contiguous() for g in grads]
        results = list(_runnable(program, "bwd")(*ctx.saved_tensors, *grads))
        if ctx.pending is not None:
            ctx.pending.finish()  # the forward's last round trip ended long ago: waited for
        for i, spec in enumerate(ctx.param_specs):
            if results[i] is not None:
                # the spec is copied so that sharding propagation on the gradient can never
                # change the parameter's
                results[i] = DTensor(results[i], copy.copy(spec), requires_grad=False)
        return (None, None, *results)


def _runnable(program: LocalProgram, phase: str) -> Callable:
    """The graph to run: the program's own (in-place reductions, or compiled), except while
    Dynamo traces the module (torch.compile of the parallel module), which needs the
    functional graph."""
    if torch.compiler.is_compiling() and not program.compiled:
        return getattr(program, f"{phase}_gm")
    return getattr(program, phase)


def _run_split_forward(ctx, program: LocalProgram, inputs: list) -> list:
    """The forward cut at its last small round trip (deferred_tail.py): module outputs the
    epilogue makes are DeferredValues (it makes no saved tensor)."""

    if program.pending is not None:
        program.pending.finish()  # the last step's round trip, long done: waited for first
    split = program.split
    got = split.main(*inputs)
    n_main = len(split.from_main)
    pending = PendingTail(split, list(got[n_main:]))
    program.pending = ctx.pending = pending
    results: list = [None] * (n_main + len(split.from_tail))
    for k, v in zip(split.from_main, got[:n_main]):
        results[k] = v
    device = next(t.device for t in got[n_main:] if isinstance(t, torch.Tensor))
    for k, like in zip(split.from_tail, split.tail_vals):
        results[k] = DeferredValue(like, pending, k, device)
    return results
