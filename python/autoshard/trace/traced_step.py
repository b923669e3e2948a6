"""What tracing returns: ``TracedStep``, the joint graph with the role of each of its inputs
and outputs, and the records it is made of. Everything after tracing reads these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.trace.step_schedule import StepSchedule, schedule_step


@dataclass(frozen=True)
class ForwardInputs:
    """Positional and keyword inputs of ``forward`` (for keyword-only arguments)."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class GraphOutput:
    node: fx.Node | None  # producer (a getitem is kept here; graph_export folds it)
    role: str  # "output", "grad" or "mutation" (the new value of an input written in place)
    output_index: int | None = None  # role output: index among the forward outputs
    grad_of: str | None = None  # role grad / mutation: the placeholder name


@dataclass
class TracedStep:
    """A traced training step: the joint graph and what each of its inputs/outputs means."""

    gm: fx.GraphModule
    fake_mode: FakeTensorMode
    device: torch.device
    param_fqns: dict[str, str]  # placeholder name -> parameter fqn (original model names)
    buffer_fqns: dict[str, str]  # placeholder name -> buffer fqn
    input_nodes: list[str]  # placeholder names, by flattened forward input index
    input_metas: list[Any]  # per flattened input: (shape, dtype) for tensors, else the value
    input_spec: Any  # pytree spec of (args, kwargs)
    tangent_of: dict[str, int]  # tangent placeholder name -> forward output index
    outputs: list[GraphOutput]  # in the output node's order, None entries dropped
    num_forward_outputs: int
    output_spec: Any  # pytree spec of the forward's return value
    source_captured: bool  # whether nodes carry the user's source lines
    trace_seconds: float = 0.0
    # node name -> positions of inputs that must arrive without a collective (mixed precision)
    local_inputs: dict[str, list[int]] = field(default_factory=dict)
    # the user's forward signature: calls are bound to the traced inputs by name (input_binding.py)
    forward_signature: Any = None
    # per flattened input: whether the traced example required grad (input gradients)
    input_requires_grad: list[bool] = field(default_factory=list)
    # True: the joint forward+backward step; False: the forward alone (inference)
    joint: bool = True
    training: bool = True  # the model's mode when traced (dropout, batch statistics)
    # with_sharding_constraint calls: clone node name -> (layout strs, " at <source line>")
    sharding_pins: dict[str, tuple] = field(default_factory=dict)
    # context parallelism: the load_balance.LoadBalance the sequence was traced with (head-
    # tail order; a retrace for new shapes or modes uses it too), or None
    load_balance: Any = None
    # torch's JointWithDescriptors of the export (AutoParallel's autop.joint_with_descriptors)
    joint_with_descriptors: Any = None

    @property
    def schedule(self) -> StepSchedule:
        """The step's schedule (step_schedule.py), computed at first use after tracing and
        kept (not a field: tracing and block extrapolation fill the fields)."""
        graph = self.gm.graph
        key = (id(graph), len(graph.nodes))  # computed again if the graph was edited
        cached = self.__dict__.get("_schedule")
        if cached is None or cached[0] != key:
            grads = [
                o.node for o in self.outputs if o.role == "grad" and isinstance(o.node, fx.Node)
            ]
            cached = (key, schedule_step(self.gm, set(self.tangent_of), grads))
            self.__dict__["_schedule"] = cached
        return cached[1]

    def placeholder(self, name: str) -> fx.Node:
        for n in self.gm.graph.find_nodes(op="placeholder"):
            if n.name == name:
                return n
        raise KeyError(name)
