"""What ``AutoParallel.optimize_placement()`` returns: one object with two views of the plan.

- AutoParallel's view: a dict ``{fx.Node of autop.gm: OpSpec}`` (torch's own
  ``OpSpec`` / ``DTensorSpec`` types), so ``placement[node].output_specs.placements`` reads a
  node's chosen layout exactly as AutoParallel users do, and hand-edited entries are honoured
  by ``apply_placement``.
- autoshard's view: the plan JSON (docs/formats.md section 3) as ``result.plan``; string keys
  (``result["nodes"]``, ``result.get("summary")``) read that JSON too, so code written
  against the plan dict keeps working (nodes are never strings, so the two cannot clash).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx as fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSpec

from autoshard.placements import layout_from_strs, layout_to_strs
from autoshard.program.interpreter import tensor_refs


def _spec(mesh: DeviceMesh, strs, val: Any) -> DTensorSpec | None:
    if strs is None:
        return None
    meta = (
        TensorMeta(val.shape, tuple(val.stride()), val.dtype)
        if isinstance(val, torch.Tensor)
        else None
    )
    return DTensorSpec(mesh, layout_from_strs(strs, mesh.ndim), tensor_meta=meta)


class SpecMaker:
    """Layout strings (and the tensor they lay out) -> DTensorSpec, each distinct spec built
    once: a repeated block repeats its layouts."""

    def __init__(self, mesh: DeviceMesh):
        self.mesh = mesh
        self._built: dict = {}

    def __call__(self, strs, val) -> DTensorSpec | None:
        if strs is None:
            return None
        key = (
            (tuple(strs), tuple(val.shape), tuple(val.stride()), val.dtype)
            if isinstance(val, torch.Tensor)
            else (tuple(strs),)
        )
        if key not in self._built:
            self._built[key] = _spec(self.mesh, strs, val)
        # every caller gets its own copy (a shallow one, much cheaper than building and
        # checking a spec), so editing one node's spec in place edits only that node
        return copy.copy(self._built[key])


def node_op_spec(node: fx.Node, entry: dict, spec: SpecMaker) -> OpSpec:
    """The OpSpec of one plan entry or strategy of ``node`` (``{"outputs": [layout...],
    "inputs": [layout...]}``, inputs in the plan's order of the node's tensor arguments)."""
    val = node.meta.get("val")
    outs = entry["outputs"]
    if isinstance(val, (tuple, list)):
        out_specs = tuple(spec(s, v) for s, v in zip(outs, val))
    else:
        out_specs = spec(outs[0], val)
    args = tensor_refs(node.args, node.kwargs)  # the plan's input order
    ins = entry.get("inputs") or ([outs[0]] if node.op == "placeholder" else [])
    sources = args if args else [node] * len(ins)  # a placeholder's own tensor
    return OpSpec(out_specs, [spec(s, a.meta.get("val")) for s, a in zip(ins, sources)])


class PlacementResult(dict):
    """``{fx.Node: OpSpec}`` plus ``.plan`` (the plan JSON). See the module docstring.

    The node view is built on first use: a plan of Llama-3-70B has ~22,000 nodes and ~50,000
    specs (about a second), which a caller who hands the result to apply_placement, or reads
    only the plan JSON, never needs."""

    def __init__(self, plan: dict, gm: fx.GraphModule, mesh: DeviceMesh):
        super().__init__()
        self.plan = plan
        self.mesh = mesh
        self._gm: fx.GraphModule | None = gm  # None once the node view is built
        self._original: dict[fx.Node, tuple] = {}

    def _build(self) -> None:
        gm, self._gm = self._gm, None
        if gm is None:
            return
        nodes = self.plan.get("nodes", {})
        spec = SpecMaker(self.mesh)
        for node in gm.graph.nodes:
            entry = nodes.get(node.name)
            if entry is None and node.target is _getitem and node.args[0].name in nodes:
                # getitems are folded into their producer in the plan: element k's layout
                outs = nodes[node.args[0].name].get("outputs") or []
                k = node.args[1]
                if k < len(outs) and outs[k] is not None:
                    entry = {"outputs": [outs[k]], "inputs": [outs[k]]}
            if entry is None or not entry.get("outputs"):
                continue
            op_spec = node_op_spec(node, entry, spec)
            dict.__setitem__(self, node, op_spec)
            self._original[node] = self._layouts(op_spec)

    # ---- the node view (built on first use) and the plan-JSON view ------------------------
    def __getitem__(self, key):
        if isinstance(key, str):
            return self.plan[key]
        self._build()
        return super().__getitem__(key)

    def get(self, key, default=None):
        if isinstance(key, str):
            return self.plan.get(key, default)
        self._build()
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        if isinstance(key, str):
            return key in self.plan
        self._build()
        return super().__contains__(key)

    def __reduce__(self):  # pickles (and deep-copies) as the plan JSON: nodes do not pickle
        return (dict, (self.plan,))

    # ---- back to a plan ---------------------------------------------------------------------
    @staticmethod
    def _layouts(spec: OpSpec) -> tuple:
        outs = spec.output_specs
        outs = outs if isinstance(outs, tuple) else (outs,)
        return (
            tuple(None if s is None else tuple(layout_to_strs(s.placements)) for s in outs),
            tuple(
                None if s is None else tuple(layout_to_strs(s.placements))
                for s in (spec.input_specs or ())
            ),
        )

    def to_plan(self) -> dict:
        """The plan JSON with every entry edited since optimize_placement (``result[node] =
        OpSpec(...)``) written back, for apply_placement."""
        plan = copy.deepcopy(self.plan)
        nodes = plan.setdefault("nodes", {})
        for node, spec in dict.items(self):
            if not isinstance(spec, OpSpec):
                raise TypeError(
                    f"placement of node {node}: expected an OpSpec, got " f"{type(spec).__name__}"
                )
            now = self._layouts(spec)
            if self._original.get(node) == now:
                continue
            if node.target is _getitem:
                raise ValueError(
                    f"placement of {node.name}: a getitem takes its producer's "
                    f"layout; edit {node.args[0].name} instead"
                )
            outs, ins = now
            entry = dict(nodes.get(node.name) or {})
            entry["outputs"] = [None if o is None else list(o) for o in outs]
            if ins:
                entry["inputs"] = [None if i is None else list(i) for i in ins]
            nodes[node.name] = entry
        return plan


def _built_first(name: str):
    """dict's method ``name`` for PlacementResult: the node view is built before it runs."""
    method = getattr(dict, name)

    def call(self, *args, **kwargs):
        self._build()
        return method(self, *args, **kwargs)

    call.__name__ = name
    return call


for _name in (
    "__iter__",
    "__len__",
    "__repr__",
    "__eq__",
    "__ne__",
    "__setitem__",
    "__delitem__",
    "__reversed__",
    "keys",
    "values",
    "items",
    "pop",
    "popitem",
    "setdefault",
    "update",
    "copy",
    "clear",
    "__or__",
    "__ior__",
):
    setattr(PlacementResult, _name, _built_first(_name))


def plan_of(placement: Any) -> dict:
    """The plan JSON of what apply_placement was given: a PlacementResult, a plan dict, or
    a ``{node: OpSpec}`` dict built by hand (every planned node must be in it)."""
    if isinstance(placement, PlacementResult):
        return placement.to_plan()
    if isinstance(placement, dict) and placement and all(isinstance(k, fx.Node) for k in placement):
        nodes = {}
        for node, spec in placement.items():
            outs, ins = PlacementResult._layouts(spec)
            entry = {"outputs": [None if o is None else list(o) for o in outs]}
            if ins:
                entry["inputs"] = [None if i is None else list(i) for i in ins]
            nodes[node.name] = entry
        return {"version": 1, "nodes": nodes}
    return placement


_getitem = __import__("operator").getitem
