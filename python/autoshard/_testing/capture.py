"""Graphs for the rule validator (validate.py), captured with real values: a model's
training step traced by autoshard, or a small function, with every node's value recorded;
and the strategies the C++ rules offer for a graph. op_cases.py and hf_zoo.py build theirs
with these."""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from autoshard.planning.graph_export import graph_dict
from autoshard.trace.traced_step import TracedStep
from autoshard.trace.tracer import trace_training_step


class ValidationSetupError(RuntimeError):
    """The graph or the values cannot be validated (not a rule failure)."""


@dataclass
class CapturedGraph:
    """A graph as the planner sees it (``graph``: docs/formats.md section 1) with the real
    value of every fx node from one eager CPU run (``values``: node name -> value)."""

    name: str
    gm: fx.GraphModule
    graph: dict
    values: dict[str, Any]

    def graph_json(self) -> str:
        return json.dumps(self.graph, allow_nan=False)


class _RecordingInterpreter(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm, garbage_collect_values=False)

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        # uninitialised memory may hold anything: zeros are one valid run, and a reproducible
        # one (garbage such as 1e30 would swamp the partial terms split from it downstream)
        if (
            n.op == "call_function"
            and str(n.target) in UNINITIALISED_OPS
            and isinstance(value, torch.Tensor)
        ):
            value.zero_()
        return value


def _eager_values(gm: fx.GraphModule, placeholder_values: Sequence[Any]) -> dict[str, Any]:
    interp = _RecordingInterpreter(gm)
    with torch.no_grad():
        interp.run(*placeholder_values, enable_io_processing=False)
    return {n.name: v for n, v in interp.env.items()}


def export_graph(step: TracedStep) -> dict:
    """The graph JSON of ``step`` (lifted tensor constants, e.g. the ``torch.tensor(...)``
    values transformers' GPT-2 builds in forward, are exported like buffers)."""
    return graph_dict(step)


def capture_model(
    name: str,
    model: torch.nn.Module,
    inputs: tuple,
    *,
    seed: int = 0,
    decompositions: dict | None = None,
    capture: str = "direct",
) -> CapturedGraph:
    """Traces one training step of ``model(*inputs)`` (a scalar loss) with the project's
    tracer, then runs the joint graph eagerly on CPU with the model's real weights and the
    real ``inputs`` (tangent of the loss: 1) and records every node's value.
    ``decompositions``: the tracer's (None: its defaults; ``{}`` keeps every op as ATen
    dispatches it, e.g. mean losses that the defaults rewrite as sums). ``capture``: the
    tracer's ("dynamo" sees what a model does under torch.compile, e.g. transformers' MoE
    experts take their custom grouped-matmul op there)."""
    step = trace_training_step(model, inputs, capture=capture, decompositions=decompositions)
    graph = export_graph(step)
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    flat_inputs, _ = pytree.tree_flatten((tuple(inputs), {}))
    gen = torch.Generator().manual_seed(seed)
    values = []
    for n in step.gm.graph.find_nodes(op="placeholder"):
        if n.name in step.param_fqns:
            values.append(params[step.param_fqns[n.name]].detach().clone())
        elif n.name in step.buffer_fqns:
            values.append(buffers[step.buffer_fqns[n.name]].detach().clone())
        elif n.name in step.tangent_of:
            meta = n.meta["val"]
            t = torch.randn(tuple(meta.shape), generator=gen).to(meta.dtype)
            values.append(torch.ones((), dtype=meta.dtype) if meta.dim() == 0 else t)
        else:
            values.append(flat_inputs[step.input_nodes.index(n.name)])
    return CapturedGraph(name, step.gm, graph, _eager_values(step.gm, values))


def capture_function(name: str, fn: Callable, *args: torch.Tensor) -> CapturedGraph:
    """An ATen graph of ``fn(*args)`` (make_fx, every tensor argument a graph input), for
    small targeted checks such as planted faults."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn)(*args)
    phs = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    for n in gm.graph.nodes:  # graph_export needs the value metadata make_fx records
        # (getitem nodes are folded into references; one of a None output has no value)
        if n.op == "call_function" and n.target is not operator.getitem and "val" not in n.meta:
            raise ValidationSetupError(f"node {n.name} has no value metadata")
    step = TracedStep(
        gm=gm,
        fake_mode=None,
        device=torch.device("cpu"),
        param_fqns={},
        buffer_fqns={},
        input_nodes=phs,
        input_metas=[],
        input_spec=None,
        tangent_of={},
        outputs=[],
        num_forward_outputs=0,
        output_spec=None,
        source_captured=False,
    )
    return CapturedGraph(name, gm, export_graph(step), _eager_values(gm, args))


def enumerate_strategies(graph: dict | str, mesh: Sequence[int]) -> dict:
    """``_core.enumerate_strategies`` on a graph (unsupported ops listed, not raised)."""
    from autoshard import _core

    text = graph if isinstance(graph, str) else json.dumps(graph, allow_nan=False)
    options = json.dumps({"mesh": {"shape": list(mesh)}})
    return json.loads(_core.enumerate_strategies(text, options, allow_unsupported=True))


# Ops whose outputs are uninitialised memory: only shape and dtype are compared.
UNINITIALISED_OPS = {
    "aten.empty.memory_format",
    "aten.empty_strided.default",
    "aten.empty_like.default",
    "aten.new_empty.default",
    "aten.new_empty_strided.default",
}
