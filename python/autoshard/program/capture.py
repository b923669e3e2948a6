"""Capturing one rank's step: the reference interpreter (interpreter.py) traced once with
``make_fx`` under a fake tensor mode, so that DTensor's dispatch records every op as its
local ATen op and every redistribution as explicit functional collectives. Gives the
forward and backward graphs the pass pipeline (pipeline.py) then rewrites."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor

from autoshard.program.interpreter import StepRunner, contiguous_stride
from autoshard.program.local_program import _graph_outputs
from autoshard.program.passes.uneven import UnevenDims


@dataclass
class _SavedSpec:
    """How to turn a saved local tensor back into the value the backward nodes read."""

    placements: tuple | None  # None: a plain tensor (not a DTensor)
    shape: torch.Size | None = None
    stride: tuple | None = None


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


def _output_slots(outs: list) -> list:
    slots, k = [], 0
    for o in outs:
        if isinstance(o, torch.Tensor):
            slots.append(k)
            k += 1
        else:
            slots.append(("const", o))
    return slots


@dataclass
class CapturedStep:
    """The traced forward and backward of one rank, before any pass."""

    fwd_gm: fx.GraphModule  # (param, buffer, input tensors) -> (outputs, saved tensors)
    bwd_gm: fx.GraphModule  # (saved tensors, output gradients) -> gradients per input tensor
    n_outputs: int  # tensor outputs of the module (the rest of fwd's are saved)
    output_slots: list  # per module output: index into tensor outputs, or ("const", v)
    input_tensor_positions: list[int]  # which flat inputs (params, buffers, inputs) are tensors


def capture_step(
    runner: StepRunner,
    param_locals: list[torch.Tensor],
    buffer_locals: list[torch.Tensor],
    input_values: list[Any],
    dynamic: bool = False,
) -> CapturedStep:
    """Trace ``runner``'s forward and backward into local graphs. The example tensors give
    local shapes and dtypes only (they are replaced by fake tensors; nothing runs)."""
    import torch.distributed.config as dist_config
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    n_params, n_buffers = len(param_locals), len(buffer_locals)
    flat = list(param_locals) + list(buffer_locals) + list(input_values)
    tensor_pos = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
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
    return CapturedStep(fwd_gm, bwd_gm, n_out, meta["output_slots"], tensor_pos)
