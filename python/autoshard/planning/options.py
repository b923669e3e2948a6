"""What the C++ planner is asked: one typed object instead of a dict read with ``.get``.

``PlannerOptions`` mirrors ``autoshard::PlannerOptions`` (cpp/include/autoshard/planner.h);
its JSON form (docs/formats.md section 6) is made only where the options cross into the C++
core (``plan_graph``, ``enumerate_strategies``, ``redistribution_costs`` below) or a file
(ShardingOptimizer.save, the plan cache key). Layouts are the planner's strings, one per
mesh dim: ``"S(0)"``, ``"R"``, ``"P(sum)"`` (placements.py converts DTensor placements).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BUDGET = "default"  # parameter_memory: the planner's default bounds
# time_limit_s None: the C++ planner's default (PlannerOptions::time_limit_s, planner.h)
DEFAULT_TIME_LIMIT_S = 20.0
# the least share of its limit the planner gets when the caller spent the rest (it always
# returns a plan: the greedy start takes a fraction of a second even on Llama-3-405B)
MIN_PLANNER_SHARE = 0.1


@dataclass
class PlannerOptions:
    mesh_shape: list[int]
    mesh_dim_names: list[str] | None = None
    # a built-in profile name (cost/hardware_profiles.cpp), a dict of profile fields, or
    # None: the planner's default profile
    hardware: str | dict | None = None
    # input placeholder name -> layout its value arrives in
    input_constraints: dict[str, list[str]] = field(default_factory=dict)
    # forward output index (a string: JSON object keys are) -> layout it leaves in
    output_constraints: dict[str, list[str]] = field(default_factory=dict)
    # node name -> layout of its (first) output
    node_constraints: dict[str, list[str]] = field(default_factory=dict)
    # the parameter bytes each device stores, as shares of all of them: DEFAULT_BUDGET (the
    # planner's: at most 1 / mesh size where the parameters allow), None (no budget), or
    # (low, high)
    parameter_memory: str | tuple[float, float] | None = DEFAULT_BUDGET
    memory_limit_bytes: int | None = None  # peak bytes per device; None: no limit
    time_limit_s: float | None = None  # None: the planner's default (DEFAULT_TIME_LIMIT_S)
    gap_tolerance: float | None = None  # None: the planner's default (0.001)
    max_problem_bytes: int | None = None  # None: the planner's cap on the problem's size
    repeated_layers: str = "auto"  # "auto", "tie" or "untie" (docs/repeated_layers.md)
    # how float32 matmuls run (torch.backends.cuda.matmul.fp32_precision): "ieee" (full
    # float32, PyTorch's default), "tf32" (TF32 tensor cores), or None: as the profile says
    fp32_matmul_precision: str | None = None
    # the optimizer whose state the memory estimate counts: "adam" (also AdamW, fp32
    # moments), "sgd", "sgd_momentum", "none"; None: the planner's default (adam)
    optimizer: str | None = None
    # what the backward recomputes to fit the memory limit (memory_limit_bytes, else the
    # hardware's memory less 10 %): "auto" (only what the limit needs), "none", "reshard"
    # (every block gathers its gathered weights and activations again), "selective"
    # (every block keeps its matmul and attention outputs), "full"; None: the planner's
    # default (auto). cpp/include/autoshard/recompute.h
    recompute: str | None = None
    verbose: bool = False  # the planner's own trace on stderr

    def replace(self, **changes: Any) -> "PlannerOptions":
        return dataclasses.replace(self, **changes)

    def after(self, spent_s: float) -> "PlannerOptions":
        """These options for a planner call made ``spent_s`` into the planning time (graph
        export, rank agreement, cache lookup): the time limit caps the whole, so the planner
        gets what is left (at least MIN_PLANNER_SHARE of it)."""
        limit = DEFAULT_TIME_LIMIT_S if self.time_limit_s is None else self.time_limit_s
        return self.replace(time_limit_s=max(MIN_PLANNER_SHARE * limit, limit - spent_s))

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "mesh": {"shape": list(self.mesh_shape), "dim_names": self.mesh_dim_names},
            "hardware": self.hardware,
            "input_constraints": dict(self.input_constraints),
            "output_constraints": dict(self.output_constraints),
            "node_constraints": dict(self.node_constraints),
            "verbose": self.verbose,
        }
        if self.parameter_memory != DEFAULT_BUDGET:
            out["parameter_memory"] = (
                None
                if self.parameter_memory is None
                else {"low": self.parameter_memory[0], "high": self.parameter_memory[1]}
            )
        for key in (
            "time_limit_s",
            "gap_tolerance",
            "memory_limit_bytes",
            "max_problem_bytes",
            "optimizer",
            "recompute",
        ):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.repeated_layers != "auto":
            out["repeated_layers"] = self.repeated_layers
        if self.fp32_matmul_precision is not None:
            out["fp32_matmul_precision"] = self.fp32_matmul_precision
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, d: dict) -> "PlannerOptions":
        mesh = d.get("mesh") or {}
        if "shape" not in mesh:
            raise ValueError("planner options: 'mesh' needs a 'shape'")
        budget = d.get("parameter_memory", DEFAULT_BUDGET)
        if isinstance(budget, dict):
            budget = (budget["low"], budget["high"])
        known = {f.name for f in dataclasses.fields(cls)} | {"mesh"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"planner options: unknown keys {unknown}")
        return cls(
            mesh_shape=list(mesh["shape"]),
            mesh_dim_names=mesh.get("dim_names"),
            hardware=d.get("hardware"),
            input_constraints=dict(d.get("input_constraints") or {}),
            output_constraints=dict(d.get("output_constraints") or {}),
            node_constraints=dict(d.get("node_constraints") or {}),
            parameter_memory=budget,
            memory_limit_bytes=d.get("memory_limit_bytes"),
            time_limit_s=d.get("time_limit_s"),
            gap_tolerance=d.get("gap_tolerance"),
            max_problem_bytes=d.get("max_problem_bytes"),
            repeated_layers=d.get("repeated_layers", "auto"),
            fp32_matmul_precision=d.get("fp32_matmul_precision"),
            optimizer=d.get("optimizer"),
            recompute=d.get("recompute"),
            verbose=bool(d.get("verbose", False)),
        )


# ---- the C++ core, with options as the object above ---------------------------------------
def plan_graph(graph_json: str, options: PlannerOptions) -> dict:
    """The plan JSON (docs/formats.md section 3) of a graph; the core's ValueError otherwise."""
    from autoshard import _core

    return json.loads(_core.plan_graph(graph_json, options.dumps()))


def enumerate_strategies(graph_json: str, options: PlannerOptions) -> dict:
    """Every node's strategies (ops without a rule listed, not refused): ``{"nodes": {name:
    [{"inputs", "outputs", "compute_us"}]}, "unsupported": [...]}``."""
    from autoshard import _core

    return json.loads(_core.enumerate_strategies(graph_json, options.dumps(), True))


def redistribution_costs(graph_json: str, options: PlannerOptions, node: str, arg: int) -> dict:
    from autoshard import _core

    return json.loads(_core.redistribution_costs(graph_json, options.dumps(), node, arg))
