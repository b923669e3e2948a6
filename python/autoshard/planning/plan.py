"""A plan as typed objects: ``Plan``, its ``PlanSummary`` and one ``NodePlan`` per node.

The planner answers in JSON (docs/formats.md section 3) and users keep that JSON (plan files,
``optimize_placement().plan``). The tools that read plans (``autoshard view / diff /
explain``, the verbose log, ``diff_solutions``) parse it once here, so a missing optional
field has one default in one place instead of a ``.get`` at every read. Layouts are the
planner's strings, one per mesh dim (``"S(0)"``, ``"R"``, ``"P(sum)"``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

Layout = list  # of placement strings, one per mesh dim


@dataclass
class NodePlan:
    outputs: list  # one Layout (None for a non-tensor output) per output
    inputs: list  # one Layout per tensor argument, in the graph JSON's reference order
    compute_us: float = 0.0
    comm_us: float = 0.0  # redistributing this node's inputs, in full (not only exposed)
    strategies: int | None = None  # how many the planner chose among

    @property
    def output(self) -> Layout | None:
        """The first output's layout."""
        return self.outputs[0] if self.outputs else None

    @classmethod
    def from_json(cls, d: dict) -> "NodePlan":
        return cls(
            outputs=list(d.get("outputs") or []),
            inputs=list(d.get("inputs") or []),
            compute_us=float(d.get("compute_us", 0.0)),
            comm_us=float(d.get("comm_us", 0.0)),
            strategies=d.get("strategies"),
        )


@dataclass
class StepMemory:
    """What one GPU holds over the step under the plan, in bytes (autoshard::StepMemory,
    cpp/include/autoshard/step_memory.h; docs/cost_model.md 6)."""

    peak_bytes: int = 0  # step_peak_bytes + optimizer_state: what the GPU must hold
    step_peak_bytes: int = 0  # most bytes live at once during forward + backward
    peak_at: str = ""  # the node running at that peak
    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    saved_activations: int = 0  # forward values kept for the backward
    buffers: int = 0
    inputs: int = 0

    def describe(self) -> str:
        """One line: the peak and what it is made of, in GiB."""
        gib = lambda b: f"{b / 2**30:.3f} GiB"  # noqa: E731
        return (
            f"memory per GPU: peak {gib(self.peak_bytes)} (at {self.peak_at or '?'}) = "
            f"parameters {gib(self.parameters)}, gradients {gib(self.gradients)}, optimizer "
            f"state {gib(self.optimizer_state)}, saved activations "
            f"{gib(self.saved_activations)}, the rest transient"
        )

    @classmethod
    def from_json(cls, d: dict) -> "StepMemory":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class RecomputeSummary:
    """What the backward recomputes under the plan (autoshard::RecomputeDecision,
    cpp/include/autoshard/recompute.h): the level of each block that recomputes ("reshard",
    "selective", "full"), the time it adds, and the limit it was chosen for."""

    blocks: dict[str, str] = field(default_factory=dict)
    added_us: float = 0.0
    limit_bytes: int = 0  # 0: none
    fits: bool = True

    def describe(self) -> str:
        if not self.blocks:
            return "recompute: nothing"
        levels = ", ".join(f"{b} {lvl}" for b, lvl in self.blocks.items())
        return f"recompute: {levels}; +{self.added_us / 1000:.3f} ms a step"

    @classmethod
    def from_json(cls, d: dict) -> "RecomputeSummary":
        return cls(
            blocks=dict(d.get("blocks") or {}),
            added_us=float(d.get("added_us", 0.0)),
            limit_bytes=int(d.get("limit_bytes", 0)),
            fits=bool(d.get("fits", True)),
        )


@dataclass
class PlanSummary:
    total_us: float = 0.0  # compute_us + exposed_comm_us
    compute_us: float = 0.0
    comm_us: float = 0.0  # every collective in full
    exposed_comm_us: float = 0.0  # the part not hidden behind compute
    parameter_bytes_per_gpu: float = 0.0
    lower_bound_us: float = 0.0
    solver_status: str | None = None  # "optimal", "gap tolerance" or "time limit"
    memory: StepMemory = field(default_factory=StepMemory)  # plans older than it: zeros
    recompute: RecomputeSummary = field(default_factory=RecomputeSummary)

    @classmethod
    def from_json(cls, d: dict) -> "PlanSummary":
        comm = float(d.get("comm_us", 0.0))
        return cls(
            total_us=float(d.get("total_us", 0.0)),
            compute_us=float(d.get("compute_us", 0.0)),
            comm_us=comm,
            exposed_comm_us=float(d.get("exposed_comm_us", comm)),  # older plans: all exposed
            parameter_bytes_per_gpu=float(d.get("parameter_bytes_per_gpu", 0)),
            lower_bound_us=float(d.get("lower_bound_us", 0.0)),
            solver_status=d.get("solver_status"),
            memory=StepMemory.from_json(d.get("memory") or {}),
            recompute=RecomputeSummary.from_json(d.get("recompute") or {}),
        )


@dataclass
class Plan:
    mesh_shape: list[int]
    mesh_dim_names: list[str] | None
    nodes: dict[str, NodePlan]  # in graph order
    summary: PlanSummary
    hardware: str | None = None
    report: str = ""  # the planner's text report
    preset: str | None = None  # the preset it was planned with (autoshard plan --preset)
    # per node what the graph knows and the plan does not: op, role, fqn, module, phase,
    # shape, dtype (written by `autoshard plan --out` / `demo --plan-out`, or --graph)
    node_info: dict[str, dict] = field(default_factory=dict)
    # forward nodes the backward runs again (and early nodes it runs instead of the forward)
    recompute: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict, where: str = "plan") -> "Plan":
        if not isinstance(d, dict) or not isinstance(d.get("nodes"), dict):
            raise ValueError(
                f'{where}: not a plan JSON (no "nodes" object; docs/formats.md section 3)'
            )
        mesh = d.get("mesh") or {}
        return cls(
            mesh_shape=list(mesh.get("shape") or []),
            mesh_dim_names=mesh.get("dim_names"),
            nodes={name: NodePlan.from_json(e) for name, e in d["nodes"].items()},
            summary=PlanSummary.from_json(d.get("summary") or {}),
            hardware=d.get("hardware"),
            report=str(d.get("report") or ""),
            preset=d.get("preset"),
            node_info=dict(d.get("node_info") or {}),
            recompute=list(d.get("recompute") or []),
        )

    def info(self, node: str) -> dict[str, Any]:
        """What node_info says of ``node`` (empty when the plan has none)."""
        return self.node_info.get(node, {})
