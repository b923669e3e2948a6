"""Tracing one training step into a joint forward+backward ATen graph.

The user's model (parameters on the meta device, or any device) is copied, its parameters
and buffers become fake tensors of the same global shape on the tracing device, and the
step ``loss = model(*args, **kwargs)`` plus its backward is captured with
``aot_export_joint_with_descriptors``. First Dynamo captures the model (like torch.export)
so every ATen node keeps the user's source line (``stack_trace``) and module path
(``nn_module_stack``); if Dynamo cannot capture the model we trace it directly, without
source lines.

The result, ``TracedStep``, names each graph input/output's role (parameter, buffer, input,
tangent, output, grad) from the AOT descriptors, with parameter names mapped back to the
ORIGINAL fully qualified names of the user's model.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import time
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from autoshard.trace.block_extrapolation import trace_by_blocks
from autoshard.trace.decompositions import default_decompositions
from autoshard.trace.traced_step import ForwardInputs, GraphOutput, TracedStep

log = logging.getLogger("autoshard")

aten = torch.ops.aten


def _tracing_device(device: torch.device | str | None) -> torch.device:
    """The device the fake model and inputs are made on: "cuda" means cuda:0, as fake
    tensors made on "cuda" are (so inputs already there are recognised as such)."""
    d = torch.device(device if device is not None else "cpu")
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", 0)
    return d


def _fake_model(model: nn.Module, fake_mode: FakeTensorMode, device: torch.device) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are fake tensors of the same shapes
    and dtypes on ``device``; aliased tensors (one tensor under several names) stay shared."""
    fake = copy.deepcopy(model)
    # keyed by id of the copy's own tensors, which stay alive in `fake` while we loop
    memo: dict[int, torch.Tensor] = {}

    def to_fake(t: torch.Tensor) -> torch.Tensor:
        with fake_mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

    for mod in fake.modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(to_fake(p), requires_grad=p.requires_grad)
            mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                memo[id(b)] = to_fake(b)
            mod._buffers[name] = memo[id(b)]
    return fake


def _fake_inputs(inputs: Any, fake_mode: FakeTensorMode, device: torch.device) -> Any:
    """Every tensor of ``inputs`` as a fake tensor of ``fake_mode`` on ``device``, the device
    the fake parameters are on. Sample inputs are usually made without a device (CPU, or
    fake CPU tensors when ``input_fn`` runs under the fake mode) while a CUDA mesh traces on
    cuda:0: left where they are, they would meet cuda:0 weights at the first op ("Tensor
    device mismatch"). Real, meta and fake tensors, of any device, are all converted."""

    def conv(x):
        if not isinstance(x, torch.Tensor):
            return x
        if _is_fake_of(x, fake_mode) and x.device == device:
            return x  # as given: keeps views and aliases among the inputs
        return _fake_on(x, fake_mode, device)

    return pytree.tree_map(conv, inputs)


def _is_fake_of(x: torch.Tensor, fake_mode: FakeTensorMode) -> bool:
    return isinstance(x, FakeTensor) and x.fake_mode is fake_mode


def _fake_on(x: torch.Tensor, fake_mode: FakeTensorMode, device: torch.device) -> torch.Tensor:
    """A fresh fake leaf tensor like ``x`` (shape, strides, dtype, requires_grad) on
    ``device``."""
    with fake_mode:
        t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device)
    if x.requires_grad:
        t.requires_grad_(True)
    return t


def normalize_inputs(value: Any) -> ForwardInputs:
    """``input_fn()``'s result as ForwardInputs: a tuple is splatted, a single value is one
    positional argument."""
    if isinstance(value, ForwardInputs):
        return value
    if isinstance(value, tuple):
        return ForwardInputs(args=value)
    return ForwardInputs(args=(value,))


def _merge_tied_parameters(
    gm: fx.GraphModule, param_fqns: dict[str, str], fake_mode: FakeTensorMode
) -> None:
    """One placeholder per parameter TENSOR. A tensor registered under two names (tied
    weights: GPT-2's input embedding and output projection) reaches the joint graph as two
    placeholders, each with the gradient of its own uses; the parameter's gradient is their
    sum. Rewrites ``gm`` in place: later placeholders of a tensor are replaced by the first,
    their gradient outputs are added into the first one's, and ``param_fqns`` loses them."""
    from torch._functorch._aot_autograd.descriptors import GradAOTOutput, ParamAOTInput

    kept_of_fqn: dict[str, str] = {}
    kept_of: dict[str, str] = {}  # placeholder -> the placeholder that stays
    for ph, fqn in param_fqns.items():
        kept_of[ph] = kept_of_fqn.setdefault(fqn, ph)
    if all(k == ph for ph, k in kept_of.items()):
        return
    placeholders = {n.name: n for n in gm.graph.find_nodes(op="placeholder")}
    ph_of_target = {
        n.meta["desc"].target: name
        for name, n in placeholders.items()
        if isinstance(n.meta.get("desc"), ParamAOTInput)
    }
    out_node = gm.graph.find_nodes(op="output")[0]
    values, descs = list(out_node.args[0]), list(out_node.meta["desc"])
    first_slot: dict[str, int] = {}  # kept placeholder -> index of its gradient output
    drop: set[int] = set()
    for k, (value, desc) in enumerate(zip(values, descs)):
        if not (isinstance(desc, GradAOTOutput) and isinstance(desc.grad_of, ParamAOTInput)):
            continue
        kept = kept_of.get(ph_of_target.get(desc.grad_of.target, ""), None)
        if kept is None:
            continue
        if kept not in first_slot:
            first_slot[kept] = k
            continue
        drop.add(k)
        j = first_slot[kept]
        if value is None:
            continue
        if values[j] is None:
            values[j] = value
            continue
        with gm.graph.inserting_before(out_node):
            total = gm.graph.call_function(torch.ops.aten.add.Tensor, (values[j], value))
        with fake_mode:
            total.meta["val"] = torch.ops.aten.add.Tensor(values[j].meta["val"], value.meta["val"])
        total.meta["partitioner_tag"] = "is_backward"
        values[j] = total
    out_node.args = (tuple(v for k, v in enumerate(values) if k not in drop),)
    out_node.meta["desc"] = [d for k, d in enumerate(descs) if k not in drop]
    for ph, kept in kept_of.items():
        if ph != kept:
            placeholders[ph].replace_all_uses_with(placeholders[kept])
            gm.graph.erase_node(placeholders[ph])
            del param_fqns[ph]
    gm.graph.lint()
    gm.recompile()


def _drop_skipped_cat_inputs(gm: fx.GraphModule) -> None:
    """Drops the 1-D empty inputs of ``aten.cat`` that cat skips (its legacy rule: a tensor of
    shape ``(0,)`` joins tensors of any rank), e.g. the ``torch.tensor([])`` placeholders of
    transformers' key/value caches (T5's ``EncoderDecoderCache``). DTensor's cat rule gives
    every input the output's layout and fails to split a 1-D tensor on a higher dim (T5 on
    two ranks: ``Dimension out of range``); without them the values are the same."""
    changed = False
    for node in gm.graph.find_nodes(op="call_function", target=aten.cat.default):
        tensors = node.args[0]
        vals = [t.meta.get("val") if isinstance(t, fx.Node) else None for t in tensors]
        if not all(isinstance(v, torch.Tensor) for v in vals):
            continue
        skipped = [v.dim() == 1 and v.shape[0] == 0 for v in vals]
        if not any(skipped) or all(skipped) or all(v.dim() == 1 for v in vals):
            continue
        kept = [t for t, s in zip(tensors, skipped) if not s]
        node.args = (kept,) + tuple(node.args[1:])
        changed = True
        # the dropped constants stay (unused): they are still exported, planned and fed
        # like the other tensor constants
    if changed:
        gm.recompile()


def trace_training_step(
    model: nn.Module,
    input_fn: Callable[[], Any] | Any,
    device: torch.device | str | None = None,
    *,
    capture: str = "dynamo",
    decompositions: dict | None = None,
    mp_policy: Any = None,
    training: bool | dict | None = None,
    joint: bool = True,
    extrapolate_layers: bool = True,
    load_balance: Any = None,
) -> TracedStep:
    """Trace ``model(*args, **kwargs)`` and its backward as one joint ATen graph.

    ``input_fn`` returns the GLOBAL example inputs (called under the fake mode, so it may
    create tensors of any size for free); it may also be the inputs themselves.
    ``capture``: "dynamo" (source lines and module paths recorded, falls back to "direct" if
    Dynamo fails) or "direct". ``mp_policy``: FSDP2-style mixed precision (see
    mixed_precision.py), traced into the graph. ``training``: the mode the model is traced
    in (None: as it is; False traces eval-mode behaviour: no dropout, stored batch-norm
    statistics; a dict gives the flag per submodule path). ``joint=False`` traces the
    forward alone (the inference step). ``extrapolate_layers``: a model with many
    interchangeable layers (``layers``) is traced with 3 and 4 of them and the rest
    extrapolated, checked exactly (block_extrapolation.py); False (or AUTOSHARD_TRACE_ALL_LAYERS=1)
    traces every layer. ``load_balance``: a load_balance.LoadBalance, the sequence traced in
    head-tail order for context parallelism (load_balance.py), or None.
    Constructs one static graph cannot hold (data-dependent branches, in-place buffer
    updates) raise UnsupportedModelError naming the construct and the workaround.
    """
    from autoshard.ops.flex_attention import cpu_backward_check_lifted, register_block_mask_pytree

    register_block_mask_pytree()  # a BlockMask input flattens into its tensors
    # the trace runs on fake tensors (on CPU without a GPU): FlexAttention's front end would
    # refuse a CPU backward that its higher-order ops trace the same on every device
    with _gc_paused(), cpu_backward_check_lifted():
        return _trace_training_step(
            model,
            input_fn,
            device,
            capture=capture,
            decompositions=decompositions,
            mp_policy=mp_policy,
            training=training,
            joint=joint,
            extrapolate_layers=extrapolate_layers,
            load_balance=load_balance,
        )


def _trace_training_step(
    model: nn.Module,
    input_fn: Callable[[], Any] | Any,
    device: torch.device | str | None,
    *,
    capture: str,
    decompositions: dict | None,
    mp_policy: Any,
    training: bool | dict | None,
    joint: bool,
    extrapolate_layers: bool = True,
    load_balance: Any = None,
) -> TracedStep:
    if capture not in ("dynamo", "direct"):
        raise ValueError(f"capture must be 'dynamo' or 'direct', got {capture!r}")
    t0 = time.perf_counter()
    device = _tracing_device(device)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    fake = _fake_model(model, fake_mode, device)
    if isinstance(training, dict):  # per submodule path, as module.named_modules() names them
        for path, flag in training.items():
            fake.get_submodule(path).training = bool(flag)
    elif training is not None:
        fake.train(training)

    balanced = []  # the LoadBalance each trace applied (None: natural order, the fallback)

    def trace_fake() -> TracedStep:
        one = _trace_fake_model(
            model,
            fake,
            fake_mode,
            device,
            input_fn,
            capture=capture,
            decompositions=decompositions,
            mp_policy=mp_policy,
            joint=joint,
            load_balance=load_balance,
        )
        balanced.append(one.load_balance)
        return one

    step = None
    if extrapolate_layers and capture == "dynamo":  # the layers are found by module paths

        def run_fake(mode) -> None:  # the whole forward once, eagerly, under ``mode``
            with fake_mode:
                raw = input_fn() if callable(input_fn) else input_fn
            given = normalize_inputs(raw)
            args, kwargs = _fake_inputs((tuple(given.args), dict(given.kwargs)), fake_mode, device)
            with fake_mode, mode, torch.no_grad():  # the forward ops alone: no autograd
                fake(*args, **kwargs)

        step = trace_by_blocks(fake, fake_mode, trace_fake, run_fake)
    if step is None:
        step = trace_fake()
    step.load_balance = balanced[-1] if balanced else None  # an extrapolated step's too
    step.trace_seconds = time.perf_counter() - t0
    return step


def _trace_fake_model(
    model: nn.Module,
    fake: nn.Module,
    fake_mode: FakeTensorMode,
    device: torch.device,
    input_fn: Callable[[], Any] | Any,
    *,
    capture: str,
    decompositions: dict | None,
    mp_policy: Any,
    joint: bool,
    load_balance: Any = None,
) -> TracedStep:
    """One trace of the fake copy ``fake`` of ``model``."""
    from autoshard.ops.flex_attention import check_mask_closure_values, fold_flex_attention
    from autoshard.trace.input_binding import forward_signature
    from autoshard.trace.mixed_precision import canonical_policy, collective_free_inputs

    traced_training = fake.training
    # the fake copy's parameters -> original names (identity survives Dynamo's renaming)
    fqn_of_fake = {}
    for name, p in fake.named_parameters(remove_duplicate=False):
        fqn_of_fake.setdefault(id(p), name)
    buf_of_fake = {}
    for name, b in fake.named_buffers(remove_duplicate=False):
        buf_of_fake.setdefault(id(b), name)

    with fake_mode:
        raw = input_fn() if callable(input_fn) else input_fn
    inputs = normalize_inputs(raw)
    inputs = ForwardInputs(
        *_fake_inputs((tuple(inputs.args), dict(inputs.kwargs)), fake_mode, device)
    )
    check_mask_closure_values((inputs.args, inputs.kwargs))
    flat_inputs, input_spec = pytree.tree_flatten((inputs.args, inputs.kwargs))
    input_metas = [
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in flat_inputs
    ]
    mp = canonical_policy(mp_policy)
    input_requires_grad = [isinstance(x, torch.Tensor) and x.requires_grad for x in flat_inputs]
    # the forward alone is traced with autograd off: AOT then exports an inference graph
    grad_mode = torch.enable_grad() if joint else torch.no_grad()
    try:
        with grad_mode:
            traced_mod, source_captured, jd, load_balance = _capture_and_export_balanced(
                fake, inputs, fake_mode, capture, decompositions, mp_policy, load_balance
            )
    except Exception as e:
        explained = explain_trace_error(e)
        if explained is None:
            raise
        raise explained from None
    gm = jd.graph_module
    from autoshard.ops.sharding_constraint import take_sharding_pins

    sharding_pins = take_sharding_pins(gm)  # with_sharding_constraint nodes -> pinned clones
    if "autoshard.ops.local_map" in sys.modules:  # local_map regions: one strategy each
        sharding_pins.update(sys.modules["autoshard.ops.local_map"].region_pins(gm))

    # The names in the traced module (FQNs after _restore_state_dict, else whatever the
    # capture made of them) map back to the model's FQNs through identity.
    names_in_traced = {n: id(p) for n, p in traced_mod.named_parameters(remove_duplicate=False)}
    bufs_in_traced = {n: id(b) for n, b in traced_mod.named_buffers(remove_duplicate=False)}

    from torch._functorch._aot_autograd.descriptors import (
        BufferAOTInput,
        GradAOTOutput,
        InputMutationAOTOutput,
        ParamAOTInput,
        PlainAOTInput,
        PlainAOTOutput,
        TangentAOTInput,
    )

    # forward() writes a buffer or a user input in place: the graph returns its new value,
    # which the step writes back (interpreter.StepRunner._write_back)
    written: dict[int, str] = {}  # output slot -> the placeholder it writes
    placeholders = gm.graph.find_nodes(op="placeholder")
    placeholder_of = {repr(n.meta.get("desc")): n for n in placeholders}
    input_info = jd._aot_state.fw_metadata.input_info  # per primal, in placeholder order
    out_node = gm.graph.find_nodes(op="output")[0]
    for j, (value, desc) in enumerate(zip(out_node.args[0], out_node.meta.get("desc") or [])):
        if isinstance(desc, InputMutationAOTOutput):
            target = desc.mutated_input
            fqn = (
                buf_of_fake.get(bufs_in_traced.get(target.target), target.target)
                if isinstance(target, BufferAOTInput)
                else None
            )
            ph = placeholder_of.get(repr(target))
            k = placeholders.index(ph) if ph is not None else len(input_info)
            metadata = k >= len(input_info) or input_info[k].mutates_metadata
            _check_writable(target, fqn, ph, metadata, input_requires_grad)
            written[j] = ph.name
    param_fqns, buffer_fqns, tangent_of = {}, {}, {}
    input_by_idx: dict[int, str] = {}
    for n in gm.graph.find_nodes(op="placeholder"):
        desc = n.meta.get("desc")
        if isinstance(desc, ParamAOTInput):
            pid = names_in_traced.get(desc.target)
            param_fqns[n.name] = fqn_of_fake.get(pid, desc.target)
        elif isinstance(desc, BufferAOTInput):
            bid = bufs_in_traced.get(desc.target)
            buffer_fqns[n.name] = buf_of_fake.get(bid, desc.target)
        elif isinstance(desc, PlainAOTInput):
            input_by_idx[desc.idx] = n.name
        elif isinstance(desc, TangentAOTInput):
            out = desc.output
            if not isinstance(out, PlainAOTOutput):
                raise NotImplementedError(
                    f"tangent of {out!r} (input mutation or aliased " "output) is not supported"
                )
            tangent_of[n.name] = out.idx
        else:
            raise NotImplementedError(
                f"graph input {n.name} has descriptor {desc!r}, which "
                "autoshard does not support (e.g. RNG state, tokens)"
            )
    _merge_tied_parameters(gm, param_fqns, fake_mode)
    _drop_skipped_cat_inputs(gm)
    fold_flex_attention(gm)  # FlexAttention's HOPs as nodes with tensor and scalar arguments
    missing = [
        i
        for i in range(len(flat_inputs))
        if i not in input_by_idx and isinstance(flat_inputs[i], torch.Tensor)
    ]
    if missing:
        log.debug("autoshard: forward inputs %s do not reach the graph", missing)
    input_nodes = [input_by_idx.get(i) for i in range(len(flat_inputs))]

    out_descs = out_node.meta.get("desc") or []
    outputs: list[GraphOutput] = []
    num_fwd = 0
    for j, (value, desc) in enumerate(zip(out_node.args[0], out_descs)):
        if j in written:
            outputs.append(GraphOutput(value, "mutation", grad_of=written[j]))
        elif isinstance(desc, PlainAOTOutput):
            outputs.append(GraphOutput(value, "output", output_index=desc.idx))
            num_fwd += 1
        elif isinstance(desc, GradAOTOutput):
            if value is None:
                continue
            target = desc.grad_of
            ph = None
            if isinstance(target, ParamAOTInput):
                pid = names_in_traced.get(target.target)
                fqn = fqn_of_fake.get(pid, target.target)
                ph = next(k for k, v in param_fqns.items() if v == fqn)
            elif isinstance(target, PlainAOTInput):
                ph = input_by_idx[target.idx]
            else:
                raise NotImplementedError(f"gradient of {target!r} is not supported")
            outputs.append(GraphOutput(value, "grad", grad_of=ph))
        elif value is None:
            continue
        else:
            raise NotImplementedError(f"graph output with descriptor {desc!r} is not " "supported")
    out_spec = getattr(jd, "out_spec", None)
    step = TracedStep(
        gm=gm,
        fake_mode=fake_mode,
        device=device,
        param_fqns=param_fqns,
        buffer_fqns=buffer_fqns,
        input_nodes=input_nodes,
        input_metas=input_metas,
        input_spec=input_spec,
        tangent_of=tangent_of,
        outputs=outputs,
        num_forward_outputs=num_fwd,
        output_spec=out_spec,
        source_captured=source_captured,
        forward_signature=forward_signature(model),
        input_requires_grad=input_requires_grad,
        joint=joint,
        training=traced_training,
        sharding_pins=sharding_pins,
        joint_with_descriptors=jd,
        load_balance=load_balance,
    )
    if mp is not None:
        grads = {o.grad_of: o.node for o in outputs if o.role == "grad" and o.grad_of in param_fqns}
        step.local_inputs = collective_free_inputs(gm, list(param_fqns), grads, mp)
    return step


def _capture_and_export_balanced(
    fake, inputs, fake_mode, capture, decompositions, mp_policy, load_balance
):
    """_capture_and_export with the sequence in head-tail order where ``load_balance``
    applies (load_balance.py); also returns the LoadBalance applied (None: natural order).
    Without ``strict``, a model the order cannot be applied to (a causal kernel with no
    rewrite) is traced again in natural order, with a warning."""
    from autoshard.trace.load_balance import LoadBalanceError

    seq = load_balance.sequence_length(inputs.args, inputs.kwargs) if load_balance else None
    args = (fake, inputs, fake_mode, capture, decompositions, mp_policy)
    if seq is None:
        return (*_capture_and_export(*args), None)
    try:
        return (*_capture_and_export(*args, (load_balance, seq)), load_balance)
    except LoadBalanceError as e:
        if load_balance.strict:
            raise
        log.warning("autoshard: %s; tracing the contiguous split instead", e)
        return (*_capture_and_export(*args), None)


def _capture_and_export(
    fake: nn.Module,
    inputs: ForwardInputs,
    fake_mode: FakeTensorMode,
    capture: str,
    decompositions: dict | None,
    mp_policy: Any,
    balance: Any = None,
):
    """Dynamo capture (for source lines; skipped if it fails) then the AOT export."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
    import torch.fx.traceback as fx_traceback

    from autoshard.trace.mixed_precision import CastingStep, canonical_policy

    mp = canonical_policy(mp_policy)
    root: nn.Module = CastingStep(fake, mp) if mp is not None else fake
    decomps = default_decompositions() if decompositions is None else decompositions
    if balance is not None:  # context parallelism: the sequence in head-tail order
        load_balance, seq = balance
        root = load_balance.wrap(root, seq)
        decomps = {**decomps, **load_balance.decompositions(seq)}
    traced_mod: nn.Module = root
    source_captured = False
    if capture == "dynamo":
        try:
            from torch._dynamo.functional_export import _dynamo_graph_capture_for_export

            from autoshard.ops.flex_attention import lift_mask_closure_inputs

            def capture():
                with fake_mode, _export_guard_check_skipped():
                    gm = _dynamo_graph_capture_for_export(root)(*inputs.args, **inputs.kwargs)
                # a BlockMask's captured tensors: inputs numbered as a call flattens them
                lift_mask_closure_inputs(gm, (tuple(inputs.args), dict(inputs.kwargs)))
                return gm

            traced_mod = capture()
            # Dynamo flattens names (L__self___w1_weight); the export's descriptors and
            # joint_with_descriptors.params_spec should name the model's own FQNs, as
            # AutoParallel's do (users index their state dicts with them). torch's renaming
            # breaks the captured graph when a tensor has two names (tied embeddings: GPT-2's
            # wte / lm_head), so such models keep Dynamo's names, as does any model the
            # renaming fails on (captured again: the failed renaming leaves it half done).
            if not _has_aliased_tensors(root):
                from torch.export import _restore_state_dict

                try:
                    _restore_state_dict(root, traced_mod)
                except Exception as e:
                    log.debug(
                        "autoshard: keeping Dynamo's parameter names (%s: %s)", type(e).__name__, e
                    )
                    traced_mod = capture()
            source_captured = True
        except Exception as e:  # Dynamo cannot capture every model; keep going without it
            log.warning(
                "autoshard: Dynamo capture failed (%s: %s); tracing directly, "
                "without source lines",
                type(e).__name__,
                str(e).splitlines()[0],
            )
            traced_mod = root
    stack = contextlib.ExitStack()
    with stack:
        with fx_traceback.preserve_node_meta():
            jd = aot_export_joint_with_descriptors(
                stack, traced_mod, tuple(inputs.args), dict(inputs.kwargs), decompositions=decomps
            )
    return traced_mod, source_captured, jd


def _has_aliased_tensors(m: nn.Module) -> bool:
    """Whether some parameter or buffer is reachable under two names."""
    ids = [id(t) for _, t in m.named_parameters(remove_duplicate=False)]
    ids += [id(t) for _, t in m.named_buffers(remove_duplicate=False)]
    return len(ids) != len(set(ids))


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic garbage collector off while tracing. Tracing allocates millions of
    objects that stay alive (nodes, fake tensors, metadata), and every full collection walks
    all of them again, so collections cost more the bigger the model (10 % of tracing
    Llama-3-8B). The garbage left is collected when the collector is back on."""
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _export_guard_check_skipped():
    """Dynamo's export capture builds the guards of the captured frame only to report
    violations of ``dynamic_shapes`` constraints. We capture with static shapes, pass no
    constraints and never run the guards, so the check can only cost time (8 % of tracing
    Llama-3-8B: guards for every parameter). Other torch versions without this hook trace
    unchanged."""
    from torch._dynamo import functional_export

    check = getattr(functional_export, "_suggest_or_raise_constraint_violation", None)
    if check is None:
        yield
        return
    functional_export._suggest_or_raise_constraint_violation = lambda *a, **k: None
    try:
        yield
    finally:
        functional_export._suggest_or_raise_constraint_violation = check


class UnsupportedModelError(ValueError):
    """The model does something one static traced graph cannot hold."""


_DATA_DEPENDENT = (
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "GuardOnDataDependentSymNode",
    "UserError",
)


def explain_trace_error(e: Exception) -> Exception | None:
    """A clear error for tracing failures caused by the user's model (the torch-internal
    message names fake-tensor machinery, not the line in forward); None if unknown."""
    name = type(e).__name__
    if name in _DATA_DEPENDENT and (name != "UserError" or "data-dependent" in str(e).lower()):
        return UnsupportedModelError(
            f"autoshard: forward() reads a tensor's VALUE while tracing{_user_line(e)}: "
            "a data-dependent branch (`if x.sum() > 0:`), `.item()` / `.tolist()`, or an "
            "output whose shape depends on data (`nonzero`, boolean-mask indexing). "
            "autoshard plans one static graph for every step, so that cannot be traced. "
            "Workarounds: compute both branches and select with torch.where (or use "
            "torch.cond), keep sizes fixed (masks instead of indexing), or decide the branch "
            "outside the model and pass it as a Python value. "
            f"(torch: {name}: {str(e).splitlines()[0] if str(e) else ''})"
        )
    message = str(e)
    if "convert all Tensors to FakeTensors" in message and "flex_attention" in message:
        return UnsupportedModelError(
            "autoshard: a FlexAttention mask_mod or score_mod reads a tensor that is not an "
            "input of the traced step: an attribute of a callable object or a global "
            "variable, which torch's pytree does not flatten out of a BlockMask, so it would "
            "be baked into the graph. Make the mask_mod a function (or functools.partial) "
            "that captures the tensor, as torchtitan's document masks do: autoshard then "
            "binds it as an input like the mask's own tensors; or build the mask inside the "
            "model's forward"
        )
    return None


def _user_line(e: Exception) -> str:
    """`` at model.py:12: `if h.sum() > 0:` `` - the innermost frame of the model's own code
    (not torch's, autoshard's or a library helper's: user_frames.py), where it asked for the
    value."""
    import os
    import traceback

    from autoshard.user_frames import AUTOSHARD_DIR, Frame, user_frame

    here = AUTOSHARD_DIR
    # autoshard's own frames are the tracer here, never the model
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if "<" not in f.filename and not os.path.abspath(f.filename).startswith(here)
    ]
    frame = user_frame(
        Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip()) for f in frames
    )
    if frame is None:
        return ""
    return f" at {os.path.basename(frame.filename)}:{frame.lineno}" + (
        f": `{frame.code}`" if frame.code else ""
    )


def _check_writable(desc, buffer_fqn: str | None, ph, metadata: bool, input_requires_grad: list):
    """forward() writes ``desc`` (placeholder ``ph``) in place: buffers (BatchNorm's running
    statistics, counters) and inputs that need no gradient get their new values written back
    after the forward; the rest raises naming what to change."""
    from torch._functorch._aot_autograd.descriptors import BufferAOTInput, PlainAOTInput

    if isinstance(desc, PlainAOTInput) and input_requires_grad[desc.idx]:
        raise UnsupportedModelError(
            f"autoshard: forward() modifies input {desc.idx} in place, and that input "
            "requires grad: work on a copy (x = x.clone()) or out of place, or pass it "
            "without requires_grad"
        )
    if not isinstance(desc, (PlainAOTInput, BufferAOTInput)) or ph is None:
        raise UnsupportedModelError(
            f"autoshard: forward() modifies {desc!r} in place, which the planned step does "
            "not write back (parameters change in the optimizer step only): work on a copy "
            "or out of place"
        )
    if metadata:
        what = f"buffer '{buffer_fqn}'" if buffer_fqn else f"input {desc.idx}"
        raise UnsupportedModelError(
            f"autoshard: forward() changes the shape, dtype or layout of {what} in place "
            "(resize_, t_, set_, ...), which the planned step cannot write back: "
            "compute the new value out of place"
        )
