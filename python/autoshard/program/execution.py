"""Running a rank's program: as one autograd node (``ProgramFunction``: the forward graph
now, the backward graph when autograd reaches it), eagerly or compiled by inductor
(``compile_program``), with the forward's last small round trip deferred where the
program was split there (passes/deferred_tail.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch.distributed.tensor import DTensor

from autoshard.program.interpreter import mark_integer_outputs
from autoshard.program.local_program import LocalProgram, copy_graph_module
from autoshard.program.passes.deferred_tail import DeferredValue, PendingTail


def _check_compilable(program: LocalProgram) -> None:
    """Refuses graphs torch.compile cannot take, naming the fix. FlexAttention: the program
    calls its higher-order ops with their mod buffers as arguments (the tensors a mask reads,
    the context-parallel positions), a form Dynamo does not accept ("too many values to
    unpack" in torch 2.13; it takes the front end's call, with buffers as closures), and
    inductor has no CPU FlexAttention backward."""
    flex = {torch.ops.higher_order.flex_attention, torch.ops.higher_order.flex_attention_backward}
    for gm in (program.fwd, program.bwd):
        if any(n.op == "call_function" and n.target in flex for n in gm.graph.nodes):
            raise NotImplementedError(
                "autoshard: compile=True is not supported yet for models with FlexAttention "
                "(torch.compile does not take the per-rank program's FlexAttention calls); "
                "pass compile=False: the program then runs eagerly, FlexAttention as torch's "
                "unfused implementation (the scores materialised), on GPU too"
            )


def compile_program(program: LocalProgram) -> LocalProgram:
    """Compile both graphs with inductor (CPU or GPU); the FX graphs stay for inspection.
    Static shapes: a step's local shapes are fixed by the plan."""
    _check_compilable(program)
    # inductor orders nodes by their inputs alone and would wait for a collective as soon as
    # it could (the backward would start by waiting for the loss normaliser it divides by
    # at its end): waits go just before their first use, as in the program's schedule.
    # (Not raise_comms: it would issue every parameter gather at the top, without the
    # schedule's bound on prefetched bytes.)
    overlap = {
        "reorder_for_compute_comm_overlap": True,
        "reorder_for_compute_comm_overlap_passes": ["sink_waits"],
    }

    if program.one_in_flight:  # passes/in_flight.py: waits stay where the pass put them
        overlap = {}

    def compiled(gm):
        return torch.compile(gm, backend="inductor", fullgraph=True, dynamic=False, options=overlap)

    # compiled on first call: the training step runs split.main (when the forward has a
    # deferred tail; the tail's few scalar ops stay eager), the no-grad step fwd
    program.fwd, program.bwd = compiled(program.fwd), compiled(program.bwd)
    if program.split is not None:
        program.split.main = compiled(program.split.main)
    program.compiled = True
    return program


@dataclass
class ProgramRunState:
    """What running a program changes, kept apart from the program (whose graphs do not
    change once lowered); one per program the runtime holds, made anew with it."""

    # rng_check.py: the ranks' random generators were compared at the first eager run
    random_states_checked: bool = False
    # the last training forward's round trip, not yet waited for (passes/deferred_tail.py)
    pending: PendingTail | None = None
    # count saved_bytes on each training forward (runtime/memory_probe.py sets it while it
    # measures: the count walks every saved tensor, work a step does not need otherwise)
    count_saved: bool = False
    # bytes the last counted forward kept for the backward: the storages of its saved
    # tensors that are not its inputs' (parameters, buffers, inputs), each counted once
    saved_bytes: int = 0


class ProgramFunction(torch.autograd.Function):
    """The step as one autograd node running the lowered program. Inputs: the parameters
    (the first ``n_dtensors`` as DTensors, or all as local shards), the buffers' local
    shards and the user's tensor inputs; outputs are the local module outputs. The program
    runs on the parameters' local shards; the gradients of DTensor inputs (already in the
    parameters' layouts) go back as DTensors with the parameters' specs."""

    @staticmethod
    def forward(ctx, program: LocalProgram, state: ProgramRunState, n_dtensors: int, *tensors):
        params = tensors[:n_dtensors]
        local = [p._local_tensor for p in params]
        ctx.pending = None
        if program.split is not None and not torch.compiler.is_compiling():
            results = _run_split_forward(ctx, program, state, [*local, *tensors[n_dtensors:]])
        else:
            results = _runnable(program, "fwd")(*local, *tensors[n_dtensors:])
        outs, saved = results[: program.n_outputs], results[program.n_outputs :]
        ctx.program = program
        ctx.param_specs = [p._spec for p in params]
        ctx.save_for_backward(*saved)
        if state.count_saved and not torch.compiler.is_compiling():
            state.saved_bytes = own_storage_bytes(saved, [*local, *tensors[n_dtensors:]])
        mark_integer_outputs(ctx, outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        program: LocalProgram = ctx.program
        grads = [g.contiguous() for g in grads]
        if ctx.pending is not None and program.one_in_flight:
            # one collective in flight: the forward's last round trip (ended long ago) is
            # waited for before the backward issues its own
            ctx.pending.finish()
        args = [*ctx.saved_tensors, *grads]
        if not torch.compiler.is_compiling():
            # autograd's copies of the saved tensors go now (unless the graph is kept for
            # another backward): with the list handed over, each is freed after its last use
            ctx.maybe_clear_saved_tensors()
        results = _run_backward(program, args)
        if ctx.pending is not None:
            ctx.pending.finish()  # the forward's last round trip ended long ago: waited for
        for i, spec in enumerate(ctx.param_specs):
            if results[i] is not None:
                # the spec is copied so that sharding propagation on the gradient can never
                # change the parameter's
                results[i] = DTensor(results[i], copy.copy(spec), requires_grad=False)
        return (None, None, None, *results)


def own_storage_bytes(tensors: list, excluded: list) -> int:
    """Bytes of the distinct storages behind ``tensors``, leaving out those of ``excluded``."""
    seen = {_storage_key(t) for t in excluded if isinstance(t, torch.Tensor)}
    total = 0
    for t in tensors:
        key = _storage_key(t) if isinstance(t, torch.Tensor) else None
        if key is not None and key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _storage_key(t: torch.Tensor):
    return (t.device, t.untyped_storage().data_ptr())


def _runnable(program: LocalProgram, phase: str) -> Callable:
    """The graph to run: the program's own (in-place reductions, or compiled), except while
    Dynamo traces the module (torch.compile of the parallel module), which needs the
    functional graph."""
    if torch.compiler.is_compiling() and not program.compiled:
        return getattr(program, f"{phase}_gm")
    return getattr(program, phase)


def _run_backward(program: LocalProgram, args: list) -> list:
    """The backward graph on ``args`` (saved tensors, then gradients). The eager graph takes
    the list itself and empties it as it reads it (torch.fx's boxed calling convention), so
    that no caller's reference keeps a saved tensor alive past its last use."""
    fn = _runnable(program, "bwd")
    eager = fn is program.run_bwd_gm and isinstance(fn, fx.GraphModule)
    if not eager or torch.compiler.is_compiling():
        return list(fn(*args))
    if program.boxed_bwd is None:
        program.boxed_bwd = copy_graph_module(fn, boxed=True)
        program.bwd_unread_inputs = unread_inputs(program.boxed_bwd)
    # an input the graph never reads would stay bound to a local of the boxed graph until it
    # returns (torch.fx frees placeholders after their last use only when they have one),
    # keeping e.g. a saved tensor it shares storage with alive through the whole backward
    for k in program.bwd_unread_inputs:
        args[k] = None
    return list(program.boxed_bwd(args))


def unread_inputs(gm: fx.GraphModule) -> tuple[int, ...]:
    """Positions of ``gm``'s placeholders that no node reads."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return tuple(k for k, n in enumerate(placeholders) if not n.users)


def _run_split_forward(ctx, program: LocalProgram, state: ProgramRunState, inputs: list) -> list:
    """The forward cut at its last small round trip (deferred_tail.py): module outputs the
    epilogue makes are DeferredValues (it makes no saved tensor)."""

    if state.pending is not None:
        state.pending.finish()  # the last step's round trip, long done: waited for first
    split = program.split
    got = split.main(*inputs)
    n_main = len(split.from_main)
    pending = PendingTail(split, list(got[n_main:]))
    state.pending = ctx.pending = pending
    results: list = [None] * (n_main + len(split.from_tail))
    for k, v in zip(split.from_main, got[:n_main]):
        results[k] = v
    device = next(t.device for t in got[n_main:] if isinstance(t, torch.Tensor))
    for k, like in zip(split.from_tail, split.tail_vals):
        results[k] = DeferredValue(like, pending, k, device)
    return results
