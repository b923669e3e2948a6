"""A step's time and peak memory from a per-rank program graph, by replaying its nodes in
order on one compute stream and one communication stream per process group.

- Every launched node (call_function) costs the host ``launch_overhead_us`` on the compute
  stream, whatever runs it: a kernel or a collective is enqueued by the host in graph order.
- A compute node then runs for its estimated time on the compute stream.
- A functional collective starts when it is issued and its group's stream is free (NCCL
  runs one communicator's collectives in order, beside compute), and ends its time later.
- ``wait_tensor`` holds the compute stream until its collective has ended: the time it
  waits is exposed communication. A collective without a wait (c10d's in-place ops) is
  waited for where it is issued.
Peak memory is torch's liveness tracker (``MemoryTracker``) over the same order, every
device counted (a CPU run is a run too)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._inductor.fx_passes.memory_estimator import MemoryTracker

from autoshard.graph_passes.debug_helpers import (
    _group_name,
    _is_communication_node,
    is_async_collective,
    is_wait,
)

DEFAULT_LAUNCH_OVERHEAD_US = 1.0  # the host's cost to enqueue one kernel or collective


@dataclass(frozen=True)
class GraphMetrics:
    """Times in microseconds, memory in bytes."""

    total_time: float  # when the last stream finishes
    compute_time: float  # the compute nodes' estimated times, summed
    communication_time: float  # the collectives' estimated times, summed
    exposed_comm_time: float  # time the compute stream waits for collectives
    peak_memory: int  # the most bytes live at once


def _collective_of(wait: torch.fx.Node) -> torch.fx.Node | None:
    """The collective a ``wait_tensor`` waits on (through views the graph put between)."""
    node = wait.args[0] if wait.args else None
    while isinstance(node, torch.fx.Node) and not _is_communication_node(node):
        node = node.args[0] if node.op == "call_function" and node.args else None
    return node if isinstance(node, torch.fx.Node) else None


class _Streams:
    """The compute stream's clock and each process group's communication clock."""

    def __init__(self):
        self.compute = 0.0
        self.comm: dict[str, float] = {}
        self.ends: dict[torch.fx.Node, float] = {}
        self.exposed = 0.0

    def issue(self, collective: torch.fx.Node, group: str, duration: float) -> None:
        start = max(self.compute, self.comm.get(group, 0.0))
        self.comm[group] = self.ends[collective] = start + duration

    def wait_until(self, end: float) -> None:
        self.exposed += max(0.0, end - self.compute)
        self.compute = max(self.compute, end)

    def finish(self) -> float:
        return max([self.compute, *self.comm.values()])


def estimate_graph_metrics(
    gm: torch.fx.GraphModule,
    runtime_estimator: Callable[[torch.fx.Node], float],
    launch_overhead_us: float = DEFAULT_LAUNCH_OVERHEAD_US,
) -> GraphMetrics:
    """Replay ``gm``'s nodes in graph order (module docstring) with ``runtime_estimator``'s
    time per node, e.g. ``debug_helpers.make_custom_runtime_estimation(mesh)``."""
    memory = MemoryTracker(gm.graph, device_filter=lambda device: True)
    streams = _Streams()
    compute = communication = 0.0
    for node in gm.graph.nodes:
        memory.schedule_node(node)
        if node.op != "call_function":
            continue
        duration = float(runtime_estimator(node))
        streams.compute += launch_overhead_us
        if is_wait(node):
            collective = _collective_of(node)
            streams.wait_until(streams.ends.pop(collective, streams.compute))
        elif _is_communication_node(node):
            communication += duration
            group = _group_name(node) if is_async_collective(node) else "c10d"
            streams.issue(node, group, duration)
            if not is_async_collective(node):
                streams.wait_until(streams.ends.pop(node))
        else:
            compute += duration
            streams.compute += duration
    return GraphMetrics(
        total_time=streams.finish(),
        compute_time=compute,
        communication_time=communication,
        exposed_comm_time=streams.exposed,
        peak_memory=int(memory.peak_memory),
    )
