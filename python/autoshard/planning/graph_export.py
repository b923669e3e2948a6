"""The tensor graph JSON of docs/formats.md section 1, written from a TracedStep."""

from __future__ import annotations

import json
import math
import operator
from typing import Any, Collection

import torch
import torch.fx as fx

from autoshard.trace.step_schedule import recomputable
from autoshard.trace.traced_step import TracedStep
from autoshard.user_frames import module_path, source_line
from autoshard.ops.flex_attention import is_flex_attention_call
from autoshard.ops.user_rules import node_strategies, user_rule_of


def dtype_str(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_ref(value: fx.Node) -> dict:
    """A reference {"ref": producer, "index": k}, folding getitem(producer, k)."""
    if value.op == "call_function" and value.target is operator.getitem:
        src, idx = value.args
        return {"ref": src.name, "index": int(idx)}
    return {"ref": value.name, "index": 0}


def _float(x: float) -> Any:
    if math.isfinite(x):
        return float(x)
    # JSON has no infinities; the planner treats scalar values as opaque
    return "inf" if x > 0 else ("-inf" if x < 0 else "nan")


def encode_arg(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return tensor_ref(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [encode_arg(v) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_str(value)}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    raise TypeError(f"cannot encode argument {value!r} of type {type(value).__name__}")


def _meta_entry(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return {"shape": [int(s) for s in v.shape], "dtype": dtype_str(v.dtype)}
    return None


def _holds_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def output_metas(node: fx.Node) -> list:
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return [_meta_entry(v) for v in val]
    entry = _meta_entry(val)
    return [entry]


def _runs_in(name: str, schedule) -> dict:
    """The node's pass where it differs from its autograd phase (a backward node run in the
    forward, its output kept for the backward): the planner's memory estimate follows the
    program's passes (step_memory.h)."""
    return {"runs_in": schedule.runs_in[name]} if name in schedule.early else {}


def _recomputable(node: fx.Node) -> dict:
    """``recomputable: false`` for an op the backward must not run again (it draws random
    numbers or writes its inputs): recompute.h never picks it."""
    return {} if recomputable(node) else {"recomputable": False}


def graph_dict(step: TracedStep, free_outputs: Collection[int] = (), mesh=None) -> dict:
    """``free_outputs``: forward output indices the planner may leave in any layout. Each is
    written as tied to its tangent (role "grad" of the tangent placeholder: the output leaves
    in the layout its gradient arrives in, as a parameter's gradient leaves in the
    parameter's), so the tangent is planned with it instead of both being pinned to
    Replicate. Outputs without a tangent (no gradient flows) stay pinned (all-Replicate).
    ``mesh``: the plan's DeviceMesh, needed only where an op has a user sharding rule
    (user_rules.py), which is evaluated for it into the node's ``strategies``."""
    gm = step.gm
    tangent_of_output = {idx: name for name, idx in step.tangent_of.items()}
    phase = step.schedule.phase
    ruled: dict = {}  # op -> whether a user sharding rule is registered for it
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "placeholder" and not n.users and not _holds_tensor(n):
            continue  # a Python number the trace baked in (varlen's max_q): nothing to lay out
        if n.op == "placeholder":
            entry: dict[str, Any] = {"name": n.name, "op": "placeholder"}
            if n.name in step.param_fqns:
                entry.update(role="parameter", fqn=step.param_fqns[n.name])
            elif n.name in step.buffer_fqns:
                entry.update(role="buffer", fqn=step.buffer_fqns[n.name])
            elif n.name in step.tangent_of:
                entry.update(role="tangent", tangent_of=step.tangent_of[n.name])
            else:
                entry.update(role="input", input_index=step.input_nodes.index(n.name))
            entry["outputs"] = output_metas(n)
            nodes.append(entry)
        elif n.op == "call_function":
            if n.target is operator.getitem:
                continue
            if not isinstance(n.target, torch._ops.OpOverload) and not is_flex_attention_call(
                n.target
            ):
                raise NotImplementedError(
                    f"node {n.name} calls {n.target!r}, which is not an ATen operator"
                    + (f" (from {source_line(n)})" if source_line(n) else "")
                )
            entry = {
                "name": n.name,
                "op": str(n.target),
                "phase": phase[n.name],
                **_runs_in(n.name, step.schedule),
                **_recomputable(n),
                "args": [encode_arg(a) for a in n.args],
                "kwargs": {k: encode_arg(v) for k, v in n.kwargs.items()},
                "outputs": output_metas(n),
            }
            src = source_line(n)
            if src:
                entry["source"] = src
            if n.target not in ruled:  # looked up once per op: 34k nodes on Llama-3-405B
                ruled[n.target] = user_rule_of(n.target) is not None
            user_rows = node_strategies(n, mesh, src) if ruled[n.target] else None
            if user_rows is not None:
                entry["strategies"] = user_rows
            if n.name in step.local_inputs:
                entry["local_inputs"] = list(step.local_inputs[n.name])
            mod = module_path(n)
            if mod:
                entry["module"] = mod
            nodes.append(entry)
        elif n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.Tensor):
            # a tensor constant the model builds in forward (e.g. transformers' GPT-2
            # `torch.tensor([])`): to the planner it is a graph input like a buffer; the
            # runtime feeds its value (interpreter.StepRunner.constant_values)
            nodes.append(
                {
                    "name": n.name,
                    "op": "placeholder",
                    "role": "buffer",
                    "fqn": str(n.target),
                    "outputs": [_meta_entry(getattr(gm, n.target))],
                }
            )
        elif n.op == "output":
            continue
        else:
            raise NotImplementedError(
                f"graph node {n.name} has op {n.op!r} (only placeholder, "
                "call_function and output are supported)"
            )
    outputs = []
    for o in step.outputs:
        if not isinstance(o.node, fx.Node):
            continue
        ref = tensor_ref(o.node)
        if (
            o.role == "output"
            and o.output_index in free_outputs
            and o.output_index in tangent_of_output
        ):
            outputs.append({**ref, "role": "grad", "grad_of": tangent_of_output[o.output_index]})
        elif o.role == "output":
            outputs.append({**ref, "role": "output", "output_index": o.output_index})
        else:
            # a gradient, or the new value of an input written in place: both leave in
            # that input's layout, which the planner charges as the redistribution to it
            outputs.append({**ref, "role": "grad", "grad_of": o.grad_of})
    return {"version": 1, "nodes": nodes, "outputs": outputs}


def graph_json(
    step: TracedStep, indent: int | None = None, free_outputs: Collection[int] = (), mesh=None
) -> str:
    return json.dumps(graph_dict(step, free_outputs, mesh), indent=indent, allow_nan=False)
