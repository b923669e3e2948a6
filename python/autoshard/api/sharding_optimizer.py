"""AutoParallel's ``autop.sharding_optimizer``, over autoshard's planner.

AutoParallel exposes its ILP object to steer and inspect the plan. autoshard's search is
the C++ planner fed the graph JSON and the options, so this object edits the options (node
constraints, memory budget), re-plans, and reads or writes plans:

- ``add_node_constraint(node, placement=None, constraint_name=None)`` / ``remove_constraints``
- ``get_solution(verbose=False)`` / ``resolve`` -> ``{fx.Node: OpSpec}`` (placement_result.py)
- ``strats``: every node's candidate strategies as ``{fx.Node: OpStrategy}``
- ``get_json()``: nodes (op, shape, source, module, chosen layout, costs) and edges (the
  layouts each tensor is redistributed between)
- ``diff_solutions(a, b)``: totals and changed layouts between two plans;
  ``explain_placement(target, start_node=None, max_nodes=20)``: per node, what the step
  costs with its output pinned to ``target`` instead (CHOSEN / TIE / CHOSEN CHEAPER / TARGET
  CHEAPER / UNAVAILABLE); ``print_costs_for_node(node, arg=0)``: the redistribution cost
  matrix of one input (producer layouts x the node's strategies)
- ``save(path)`` / ``ShardingOptimizer.load(path)``: graph, options and solution in one JSON
  file; a loaded optimizer re-plans offline (no model, no process group), e.g. what-if
  constraints on a CPU box
- ``save_placements(path)`` / ``load_placements(path)``: the chosen layouts only; loading
  checks the mesh and the node names and returns a placement apply_placement takes.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import torch.fx as fx

from autoshard.planning.options import (
    DEFAULT_BUDGET,
    PlannerOptions,
    enumerate_strategies,
    plan_graph,
)
from autoshard.planning.options import redistribution_costs
from autoshard.placements import layout_to_strs

_MEMORY_NAMES = ("memory_constraint_high", "memory_constraint_low")


class ShardingOptimizer:
    def __init__(self, autop=None, *, saved: dict | None = None):
        self._autop = autop  # None for an optimizer loaded from a file
        self._saved = saved
        # a loaded optimizer's options, edited by the constraint methods
        self._saved_options = PlannerOptions.from_json(saved["options"]) if saved else None
        self._constraint_nodes: dict[str, str] = {}  # constraint name -> node name
        self.solution: dict | None = None  # the last plan JSON
        # AutoParallel plans a concretised copy of a dynamic-shape graph and maps its nodes
        # back through this dict; autoshard plans autop.gm itself, so the map is empty and
        # ``opt._concrete_to_orig.get(node, node)`` is the node
        self._concrete_to_orig: dict = {}
        self._strats: dict | None = None

    @property
    def graph(self) -> fx.Graph:
        """The graph the plan's nodes belong to: ``autop.gm.graph`` (keys of
        optimize_placement's result), so ``get_param_nodes(opt.graph)`` works."""
        if self._autop is None:
            raise RuntimeError(
                "a ShardingOptimizer loaded from a file has no fx graph; "
                "get_json() has its nodes"
            )
        return self._autop.gm.graph

    @property
    def strats(self) -> dict:
        """Every node's candidate strategies, ``{fx.Node of autop.gm: OpStrategy}`` (torch's
        type, as AutoParallel's ``opt.strats``): each ``OpSpec`` has the node's output and
        input layouts, before any constraint. Built on first read."""
        if self._strats is None:
            from torch.distributed.tensor._op_schema import OpStrategy

            from autoshard.api.placement_result import SpecMaker, node_op_spec

            found = enumerate_strategies(self._graph_json(), self._options())["nodes"]
            spec = SpecMaker(self._autop.mesh if self._autop else None)
            self._strats = {
                node: OpStrategy([node_op_spec(node, s, spec) for s in found[node.name]])
                for node in self.graph.nodes
                if found.get(node.name)
            }
        return self._strats

    @property
    def prob(self) -> "ConstraintView":
        """The constraints currently set, by name (AutoParallel's ``opt.prob.constraints``):
        ``memory_constraint_high`` / ``memory_constraint_low`` for the parameter memory
        bounds, and each node constraint's name (add_node_constraint's return value)."""
        return ConstraintView(self._constraint_descriptions())

    def _constraint_descriptions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        mem = self._options().parameter_memory
        if mem == DEFAULT_BUDGET:
            out["memory_constraint_low"] = out["memory_constraint_high"] = (
                "the planner's default parameter memory bounds"
            )
        elif mem is not None:
            out["memory_constraint_low"] = f"parameter bytes per device >= {mem[0]} of all"
            out["memory_constraint_high"] = f"parameter bytes per device <= {mem[1]} of all"
        pins = self._options().node_constraints
        for cname, node in self._constraint_nodes.items():
            if node in pins:
                out[cname] = f"{node} output layout = {','.join(pins[node])}"
        return out

    # ---- constraints -------------------------------------------------------------------------
    def _mesh_ndim(self) -> int:
        return self._autop.mesh.ndim if self._autop else len(self._options().mesh_shape)

    def add_node_constraint(
        self,
        node: fx.Node | str,
        placement: Sequence | None = None,
        constraint_name: str | None = None,
    ) -> list[str]:
        """Pins ``node``'s output layout (None: batch sharding, AutoParallel's default);
        returns the constraint's name for remove_constraints."""
        name = node.name if isinstance(node, fx.Node) else str(node)
        if self._autop is not None:
            self._autop.add_node_constraint(name, placement)
        else:
            from torch.distributed.tensor import Replicate, Shard

            if placement is None:
                placement = (Shard(0),) + (Replicate(),) * (self._mesh_ndim() - 1)
            if len(placement) != self._mesh_ndim():
                raise ValueError(
                    f"node {name}: expected {self._mesh_ndim()} placements, got " f"{placement!r}"
                )
            if name not in {n["name"] for n in self._saved["graph"]["nodes"]}:
                raise ValueError(f"add_node_constraint: the saved graph has no node {name!r}")
            self._options().node_constraints[name] = layout_to_strs(placement)
        cname = constraint_name or f"node_constraint_{name}"
        self._constraint_nodes[cname] = name
        return [cname]

    def add_parameter_memory_constraint(
        self, low: float | None = None, high: float | None = None
    ) -> None:
        if self._autop is not None:
            self._autop.add_parameter_memory_constraint(low, high)
        else:
            import math

            n = math.prod(self._mesh_shape())
            self._options().parameter_memory = (
                0.0 if low is None else low,
                1.0 / n if high is None else high,
            )

    def remove_constraints(self, names: Sequence[str] | str) -> None:
        """Removes node constraints by name; ``memory_constraint_high`` / ``_low`` remove the
        parameter memory constraint."""
        for cname in [names] if isinstance(names, str) else names:
            if cname in _MEMORY_NAMES:
                if self._autop is not None:
                    self._autop.remove_parameter_memory_constraint()
                else:
                    self._options().parameter_memory = None
                continue
            node = self._constraint_nodes.pop(cname, None)
            if node is None:
                raise KeyError(f"remove_constraints: no constraint named {cname!r}")
            pins = (
                self._autop._node_constraints
                if self._autop is not None
                else self._options().node_constraints
            )
            pins.pop(node, None)

    # ---- solving -----------------------------------------------------------------------------
    def get_solution(self, verbose: bool = False):
        """Plans with the current constraints. With a model: ``{fx.Node: OpSpec}`` (with
        ``.plan``); loaded from a file: the plan JSON."""
        if self._autop is not None:
            result = self._autop.optimize_placement(verbose=verbose)
            self.solution = result.plan
            return result
        from autoshard.planning.planner import log_plan, plan_traced_step

        self.solution = plan_traced_step(None, self._options(), self._graph_json())
        if verbose:
            log_plan(self.solution)
        return self.solution

    resolve = get_solution

    def get_log(self, colored: bool = False, verbose: bool = False) -> str:
        """The planner's report of the last solution (per node layouts and costs)."""
        if self.solution is None:
            raise RuntimeError("no solution yet: call get_solution() first")
        return str(self.solution.get("report", ""))

    # ---- reading ---------------------------------------------------------------------------
    def _graph(self) -> dict:
        if self._autop is not None:
            return json.loads(self._autop.graph_json())
        return self._saved["graph"]

    def _graph_json(self) -> str:
        if self._autop is not None:
            return self._autop.graph_json()
        return json.dumps(self._saved["graph"])

    def _options(self) -> PlannerOptions:
        """The options a plan is made with now: the AutoParallel's (made afresh from its
        constraints on each call), or a loaded optimizer's own (edited in place)."""
        if self._autop is not None:
            return self._autop.options()
        return self._saved_options

    def _mesh_shape(self) -> list:
        return list(self._options().mesh_shape)

    def _plan(self) -> dict:
        plan = (
            self.solution
            or (self._autop.plan if self._autop is not None else None)
            or (self._saved or {}).get("solution")
        )
        if plan is None:
            raise RuntimeError("no solution yet: call get_solution() first")
        return plan

    def get_json(self) -> dict:
        """The graph with the chosen layouts and costs: ``{"mesh", "nodes": [{name, op,
        shapes, source, module, phase, outputs, inputs, compute_us, comm_us}], "edges":
        [{src, dst, from, to}], "summary"}``; the summary has the plan's keys and
        AutoParallel's (``total``, ``comm``, ``compute``, ``transition``; _summary)."""
        graph, plan = self._graph(), self._plan()
        chosen = plan.get("nodes", {})
        nodes, edges = [], []
        for n in graph["nodes"]:
            entry = chosen.get(n["name"], {})
            nodes.append(
                {
                    "name": n["name"],
                    "op": n["op"],
                    "role": n.get("role"),
                    "phase": n.get("phase"),
                    "source": n.get("source"),
                    "module": n.get("module"),
                    "shapes": [o and o["shape"] for o in n.get("outputs", [])],
                    "outputs": entry.get("outputs"),
                    "inputs": entry.get("inputs"),
                    "compute_us": entry.get("compute_us", 0.0),
                    "comm_us": entry.get("comm_us", 0.0),
                }
            )
            refs = []
            _refs(n.get("args", []), refs)
            _refs(n.get("kwargs", {}), refs)
            for k, r in enumerate(refs):
                src = chosen.get(r["ref"], {}).get("outputs") or []
                ins = entry.get("inputs") or []
                edges.append(
                    {
                        "src": r["ref"],
                        "dst": n["name"],
                        "from": src[r["index"]] if r["index"] < len(src) else None,
                        "to": ins[k] if k < len(ins) else None,
                    }
                )
        return {
            "mesh": self._options().to_json()["mesh"],
            "nodes": nodes,
            "edges": edges,
            "summary": _summary(plan.get("summary") or {}, nodes),
        }

    # ---- comparing -------------------------------------------------------------------------
    def diff_solutions(self, a=None, b=None, limit: int = 20) -> dict:
        """What changes from plan ``a`` to plan ``b`` (plan JSON, or what get_solution /
        optimize_placement returned; None: the current solution): the totals and the nodes
        whose layouts differ, printed (as ``autoshard diff``) and returned as
        ``{"delta_us": {total_us, compute_us, comm_us, exposed_comm_us}, "changed_nodes"}``."""
        from autoshard.planning.plan import Plan
        from autoshard.planning.plan_diff import diff_lines

        pa = Plan.from_json(_as_plan(a) or self._plan())
        pb = Plan.from_json(_as_plan(b) or self._plan())
        print("\n".join(diff_lines(pa, pb, limit)))
        changed = sorted(
            n for n, e in pa.nodes.items() if n not in pb.nodes or pb.nodes[n].outputs != e.outputs
        )
        return {
            "delta_us": {
                k: getattr(pb.summary, k) - getattr(pa.summary, k)
                for k in ("total_us", "compute_us", "comm_us", "exposed_comm_us")
            },
            "changed_nodes": changed,
        }

    def explain_placement(
        self,
        target_placement: Sequence,
        start_node: fx.Node | str | None = None,
        max_nodes: int | None = 20,
        time_limit_s: float = 2.0,
    ) -> list[dict]:
        """Why nodes did not get ``target_placement`` (e.g. ``(Shard(0), Replicate())``):
        from ``start_node`` on (graph order), each node whose first output the plan lays out
        otherwise is pinned to the target and the whole step re-planned (``time_limit_s``
        each, at most ``max_nodes`` re-plans). Per node: ``status`` CHOSEN (the plan already
        has it), TIE (within 0.01 us), CHOSEN CHEAPER (by ``delta_us``), TARGET CHEAPER (a
        pinned parameter's memory share is raised to what the pin needs, as with
        add_node_constraint; or the search stopped within its gap tolerance) or UNAVAILABLE
        (no strategy or no plan with it). Printed as a table and returned."""
        target = layout_to_strs(target_placement)
        plan, graph_json = self._plan(), self._graph_json()
        graph = json.loads(graph_json)
        options = self._options().replace(time_limit_s=time_limit_s, verbose=False)
        base = float(plan["summary"]["total_us"])
        names = [n["name"] for n in graph["nodes"]]
        start = start_node.name if isinstance(start_node, fx.Node) else start_node
        if start is not None and start not in names:
            raise ValueError(f"explain_placement: the graph has no node {start!r}")
        rows, replans = [], 0
        for name in names[names.index(start) if start else 0 :]:
            outs = (plan["nodes"].get(name) or {}).get("outputs") or []
            if not outs or outs[0] is None:
                continue
            row = {"node": name, "chosen": outs[0], "target": target, "delta_us": 0.0}
            if outs[0] == target:
                row["status"] = "CHOSEN"
            elif max_nodes is not None and replans >= max_nodes:
                break
            else:
                replans += 1
                pins = dict(options.node_constraints, **{name: target})
                try:
                    pinned = plan_graph(graph_json, options.replace(node_constraints=pins))
                    delta = float(pinned["summary"]["total_us"]) - base
                    row["delta_us"] = delta
                    row["status"] = (
                        "TIE"
                        if abs(delta) < 0.01
                        else "CHOSEN CHEAPER" if delta > 0 else "TARGET CHEAPER"
                    )
                except ValueError:  # no strategy has the layout, or no plan meets it
                    row["status"] = "UNAVAILABLE"
            rows.append(row)
        print(f"{'node':<32} {'chosen':<16} {'status':<15} {'target costs':>14}")
        for r in rows:
            extra = (
                f"{r['delta_us']:+.2f} us" if r["status"] not in ("CHOSEN", "UNAVAILABLE") else ""
            )
            print(f"{r['node']:<32} {','.join(r['chosen']):<16} {r['status']:<15} {extra:>14}")
        return rows

    def print_costs_for_node(self, node: fx.Node | str, arg: int = 0, **_format) -> dict:
        """The cost (us) of bringing tensor input ``arg`` of ``node`` from each layout its
        producer can output (columns) to the layout each of the node's strategies wants
        (rows); the chosen pair is marked. Printed and returned as ``{producer, rows, cols,
        costs_us}``. (AutoParallel formats with tabulate; keywords are accepted and unused.)"""
        name = node.name if isinstance(node, fx.Node) else str(node)
        m = redistribution_costs(self._graph_json(), self._options(), name, arg)
        chosen = (self._plan()["nodes"].get(name) or {}).get("inputs") or []
        produced = (self._plan()["nodes"].get(m["producer"]) or {}).get("outputs") or []
        want = chosen[arg] if arg < len(chosen) else None
        fmt = lambda l: ",".join(l)  # noqa: E731
        width = max([8] + [len(fmt(c)) + 2 for c in m["cols"]])
        print(
            f"{name} input {arg} from {m['producer']} (rows: {name}'s layout, columns: "
            f"{m['producer']}'s; us)"
        )
        print(f"{'':<16}" + "".join(f"{fmt(c):>{width}}" for c in m["cols"]))
        for row, costs in zip(m["rows"], m["costs_us"]):
            mark = "*" if row == want else " "
            print(
                f"{mark}{fmt(row):<15}"
                + "".join(f"{c:>{width}.2f}" if c < 1e30 else f"{'-':>{width}}" for c in costs)
            )
        if want is not None and produced:
            print(f"(* chosen: {fmt(produced[0])} -> {fmt(want)})")
        return m

    # ---- files -----------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Graph, planner options, constraint names and the last solution (JSON)."""
        state = {
            "version": 1,
            "graph": self._graph(),
            "options": self._options().to_json(),
            "constraint_names": dict(self._constraint_nodes),
            "solution": self.solution or (self._autop.plan if self._autop else None),
        }
        with open(path, "w") as f:
            json.dump(state, f)

    @classmethod
    def load(cls, path: str) -> "ShardingOptimizer":
        """An optimizer from ``save``: re-plans offline; its solution is the saved one."""
        with open(path) as f:
            state = json.load(f)
        if state.get("version") != 1 or "graph" not in state or "options" not in state:
            raise ValueError(f"{path}: not a file written by ShardingOptimizer.save")
        opt = cls(saved=state)
        opt._constraint_nodes = dict(state.get("constraint_names") or {})
        opt.solution = state.get("solution")
        return opt

    def save_placements(self, path: str) -> None:
        """The chosen layouts: ``{version, mesh_shape, mesh_dim_names, placements: {node:
        {output, inputs}}}``."""
        opts = self._options()
        placements = {
            name: {"output": e.get("outputs"), "inputs": e.get("inputs")}
            for name, e in self._plan().get("nodes", {}).items()
        }
        with open(path, "w") as f:
            json.dump(
                {
                    "version": 1,
                    "mesh_shape": opts.mesh_shape,
                    "mesh_dim_names": opts.mesh_dim_names,
                    "placements": placements,
                    "graph_outputs": self._plan().get("graph_outputs"),
                    "recompute": self._plan().get("recompute", []),
                },
                f,
            )

    def load_placements(self, path: str):
        """Layouts from ``save_placements`` for this graph and mesh (no planning): with a
        model, a ``{fx.Node: OpSpec}`` for apply_placement; loaded from a file, the plan."""
        with open(path) as f:
            saved = json.load(f)
        opts = self._options()
        if (
            list(saved.get("mesh_shape", [])) != list(opts.mesh_shape)
            or saved.get("mesh_dim_names") != opts.mesh_dim_names
        ):
            raise ValueError(
                f"{path}: placements for mesh {saved.get('mesh_shape')} "
                f"{saved.get('mesh_dim_names')}, this mesh is "
                f"{opts.mesh_shape} {opts.mesh_dim_names}"
            )
        names = {n["name"] for n in self._graph()["nodes"]}
        unknown = sorted(set(saved["placements"]) - names)
        if unknown:
            raise ValueError(
                f"{path}: nodes {unknown[:5]} are not in this graph (traced from "
                "another model or torch version?)"
            )
        nodes = {
            name: {
                k: v
                for k, v in (("outputs", e.get("output")), ("inputs", e.get("inputs")))
                if v is not None
            }
            for name, e in saved["placements"].items()
        }
        plan = {
            "version": 1,
            "mesh": opts.to_json()["mesh"],
            "nodes": nodes,
            "graph_outputs": saved.get("graph_outputs"),
            "recompute": list(saved.get("recompute", [])),
        }
        self.solution = plan
        if self._autop is None:
            return plan
        from autoshard.api.placement_result import PlacementResult

        self._autop.plan = plan
        return PlacementResult(plan, self._autop.gm, self._autop.mesh)


class ConstraintView:
    """``opt.prob``: ``constraints`` maps each constraint's name to a readable description."""

    def __init__(self, constraints: dict[str, str]):
        self.constraints = constraints

    def __repr__(self) -> str:
        return f"ConstraintView({sorted(self.constraints)})"


def _refs(value: Any, out: list) -> None:
    if isinstance(value, dict) and "ref" in value:
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _refs(v, out)
    elif isinstance(value, list):
        for v in value:
            _refs(v, out)


def _summary(plan_summary: dict, nodes: list[dict]) -> dict:
    """The plan's summary (``total_us``, ``compute_us``, ``comm_us``, ...) plus the keys of
    AutoParallel's get_json summary, in its unit (microseconds): ``compute``, ``comm``
    (every collective in full), ``transition`` (0: autoshard prices re-layouts as
    communication) and ``total``, their sum as AutoParallel defines it. autoshard's own step
    estimate, with the communication hidden behind compute left out, stays ``total_us``.
    A plan without a summary (load_placements) sums its nodes' figures."""
    compute = float(plan_summary.get("compute_us", sum(n["compute_us"] or 0.0 for n in nodes)))
    comm = float(plan_summary.get("comm_us", sum(n["comm_us"] or 0.0 for n in nodes)))
    return {
        **plan_summary,
        "total": compute + comm,
        "comm": comm,
        "compute": compute,
        "transition": 0.0,
    }


def _as_plan(x) -> dict | None:
    """A plan JSON from a plan dict or an optimize_placement / get_solution result."""
    return getattr(x, "plan", x)
