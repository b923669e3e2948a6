"""torchrun worker: count the collectives one training step actually issues under a plan and
compare them with the redistributions the plan lists.

Model: ``y = x @ w.t()`` with a batch-sharded ``x`` and a replicated ``w``: the weight
gradient is ``t(mm(x.t(), dy))``, a Partial(sum) that goes through a transpose (a
non-contiguous tensor) before it reaches the replicated parameter. It must be all-reduced
exactly once, at the place the plan says.

Every functional / c10d collective is recorded by a TorchDispatchMode. With the reference
interpreter (``runtime: interpret``) it is attributed to the plan node that was running when
it was issued (the runner's ``run_node`` is wrapped to name it; collectives outside any node
belong to the graph outputs: the loss and the gradients leaving in their parameters'
layouts). With the lowered program (the default), each collective node of the program's
graphs names the plan node it came from, and the recorder checks that exactly those
collectives run.

Usage: torchrun --standalone --nproc-per-node 4 comm_count_worker.py CONFIG.json OUT_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Shard
from torch.utils._python_dispatch import TorchDispatchMode

from scenario_runner import run_scenarios

from autoshard.placements import layout_to_strs
from autoshard.program.interpreter import StepRunner
from autoshard.runtime.module_runtime import runtime_of

OUTSIDE = "<graph outputs>"


class TransposedLinear(nn.Module):
    def __init__(self, d_in: int = 8, d_out: int = 16):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d_out, d_in) / d_in ** 0.5)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y = x @ self.w.t()
        return ((y - target) ** 2).sum()


class TransposedLinearCE(TransposedLinear):
    """The same layer under cross-entropy: the loss's normaliser (the count of targets) is
    reduced in the forward and needed again by the backward."""

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(x @ self.w.t(), target)


_COLLECTIVE_NAMESPACES = {"_c10d_functional", "c10d_functional", "c10d"}
_KIND_OF_OP = {"all_reduce": "all_reduce", "allreduce_": "all_reduce",
               "all_reduce_": "all_reduce",  # the program's in-place form (reduce_in_place)
               "all_gather_into_tensor": "all_gather", "allgather_": "all_gather",
               "_allgather_base_": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
               "all_to_all_single": "all_to_all", "alltoall_": "all_to_all",
               "alltoall_base_": "all_to_all", "broadcast_": "broadcast"}


class CollectiveRecorder(TorchDispatchMode):
    """Records (plan node, collective kind, numel of the local tensor) for every collective
    op that reaches the dispatcher; waits and other c10d bookkeeping ops are ignored."""

    def __init__(self):
        super().__init__()
        self.where = OUTSIDE
        self.calls: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in _COLLECTIVE_NAMESPACES:
            name = func._schema.name.split("::")[-1]
            kind = _KIND_OF_OP.get(name)
            if kind is not None:
                t = args[0]
                if isinstance(t, (list, tuple)):
                    t = t[0]
                if isinstance(t, (list, tuple)):
                    t = t[0]
                if func.namespace == "_c10d_functional":
                    name = name.rstrip("_")  # listed as the functional op it replaces
                self.calls.append({"where": self.where, "kind": kind, "op": name,
                                   "numel": int(t.numel()) if isinstance(t, torch.Tensor) else -1})
        return func(*args, **kwargs)


def _kind(src: str, dst: str) -> str | None:
    """The collective one mesh dim needs to go from placement ``src`` to ``dst``."""
    if src == dst or dst.startswith("P") or src == "R":
        return None  # R -> S / R -> P are local
    if src.startswith("P"):
        return "all_reduce" if dst == "R" else "reduce_scatter"
    return "all_gather" if dst == "R" else "all_to_all"


def planned_redistributions(step, plan: dict) -> list[dict]:
    """Every redistribution the plan implies: each node input whose planned layout differs
    from its producer's planned output layout, each gradient leaving in its parameter's
    layout, and the loss leaving replicated (users get real values). A value is
    redistributed to one layout once per pass, and the backward reuses the forward's when
    the value is small (at most REUSE_MAX_NUMEL elements)."""
    from autoshard.program.interpreter import REUSE_MAX_NUMEL, tensor_refs

    nodes = plan["nodes"]
    backward = set(step.tangent_of)
    for n in step.gm.graph.nodes:
        if any(a.name in backward for a in n.all_input_nodes):
            backward.add(n.name)
    done: dict[str, set] = {"forward": set(), "backward": set()}

    def produced(ref) -> list[str]:
        import operator
        k = 0
        if ref.op == "call_function" and ref.target is operator.getitem:
            ref, k = ref.args
        return nodes[ref.name]["outputs"][k]

    out = []

    def add(where, src, dst, shape):
        for d, (s, t) in enumerate(zip(src, dst)):
            kind = _kind(s, t)
            if kind:
                out.append({"where": where, "kind": kind, "mesh_dim": d, "src": src, "dst": dst,
                            "shape": list(shape)})

    for n in step.gm.graph.nodes:
        if n.op != "call_function" or n.name not in nodes or "inputs" not in nodes[n.name]:
            continue
        phase = "backward" if n.name in backward else "forward"
        for ref, want in zip(tensor_refs(n.args, n.kwargs), nodes[n.name]["inputs"]):
            if want is None:
                continue
            key = (ref.name, tuple(want))
            reused = key in done[phase] or (
                phase == "backward" and key in done["forward"]
                and ref.meta["val"].numel() <= REUSE_MAX_NUMEL)
            done[phase].add(key)
            if not reused:
                add(n.name, produced(ref), want, ref.meta["val"].shape)
    for o in step.outputs:
        src = produced(o.node)
        if o.role == "grad":
            add(OUTSIDE, src, nodes[o.grad_of]["outputs"][0], o.node.meta["val"].shape)
        else:
            add(OUTSIDE, src, ["R" if p.startswith("P") else p for p in src],
                o.node.meta["val"].shape)
    return out


def run(sc: dict, rank: int) -> dict:
    from autoshard.api.autoparallel import AutoParallel
    from autoshard.runtime.module_state import load_full_state_dict, local_inputs

    mesh = init_device_mesh("cpu", tuple(sc["mesh"]), mesh_dim_names=("dp",))
    cross_entropy = sc.get("loss") == "cross_entropy"
    model_cls = TransposedLinearCE if cross_entropy else TransposedLinear
    classes = sc.get("classes", 16)
    torch.manual_seed(0)
    ref = model_cls(d_out=classes)
    with torch.device("meta"):
        meta_model = model_cls(d_out=classes)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 8, generator=g)
    target = torch.randint(0, classes, (8,), generator=g) if cross_entropy \
        else torch.randn(8, classes, generator=g)
    if sc.get("ignored"):
        target[sc["ignored"]] = -100  # ranks count different numbers of targets
    target_shape, target_dtype = tuple(target.shape), target.dtype
    with AutoParallel(meta_model, lambda: (torch.empty(8, 8),
                                           torch.empty(target_shape, dtype=target_dtype)), mesh,
                      strict=True, capture="direct", time_limit_s=5.0,
                      runtime=sc.get("runtime", "program")) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        autop.add_parameter_memory_constraint(1.0, 1.0)  # w replicated: a DDP-style plan
        step = autop.step
        pinned = None
        if sc.get("partial_through_transpose"):
            # keep the gradient Partial through the transpose before the last one: the value
            # that must be reduced is then a non-contiguous (transposed) view
            w_ph = next(ph for ph, fqn in step.param_fqns.items() if fqn == "w")
            grad = next(o.node for o in step.outputs if o.role == "grad" and o.grad_of == w_ph)
            pinned = grad.args[0]
            assert str(pinned.target) == "aten.t.default", pinned.target
            autop.add_node_constraint(pinned.name, [Partial("sum")])
        if cross_entropy:
            # the loss as a Partial sum over the batch shards, divided by the all-reduced
            # count of targets (on its own the planner gathers the tiny logits instead)
            nll = next(n for n in step.gm.graph.nodes
                       if str(n.target) == "aten.nll_loss_forward.default")
            autop.add_node_constraint(nll.name, [Partial("sum")])
        plan = autop.optimize_placement(verbose=False)
        parallel = autop.apply_placement(plan)
        step = autop.step
    parallel.to_empty(device="cpu")
    load_full_state_dict(parallel, ref.state_dict())

    recorder = CollectiveRecorder()
    a, k = local_inputs(parallel, x, target)
    if sc.get("runtime", "program") == "program":
        parallel.parallel_gm  # lowered before the recorder runs
        with recorder:
            loss = parallel(*a, **k)
            loss.backward()
        in_program = runtime_of(parallel).program.collectives()
        executed = sorted((c["op"], c["numel"]) for c in recorder.calls)
        calls = [{"where": c["where"], "kind": _KIND_OF_OP[c["op"]], "op": c["op"],
                  "numel": c["numel"], "phase": c["phase"], "members": c["members"]}
                 for c in in_program]
        result = _result(sc, parallel, ref, step, plan, x, target, loss, pinned, calls,
                         executed == sorted((c["op"], c["numel"]) for c in in_program))
        result["late_loss_scale"] = runtime_of(parallel).program.info.get("late_loss_scale")
        return result
    original = StepRunner.run_node

    def run_node(self, env, node):
        recorder.where = node.name
        try:
            return original(self, env, node)
        finally:
            recorder.where = OUTSIDE

    StepRunner.run_node = run_node
    try:
        with recorder:
            loss = parallel(*a, **k)
            loss.backward()
    finally:
        StepRunner.run_node = original
    return _result(sc, parallel, ref, step, plan, x, target, loss, pinned, recorder.calls, True)


def _result(sc, parallel, ref, step, plan, x, target, loss, pinned, calls,
            executed_as_listed) -> dict:
    ref_loss = ref(x, target)
    ref_loss.backward()
    grad = parallel.w.grad
    w_ph = next(ph for ph, fqn in step.param_fqns.items() if fqn == "w")
    grad_node = next(o.node for o in step.outputs if o.role == "grad" and o.grad_of == w_ph)
    return {"name": sc["name"], "ok": True,
            "collectives": calls,
            "executed_as_listed": executed_as_listed,
            "planned": planned_redistributions(step, plan),
            "grad_node": grad_node.name,
            "grad_node_input_layouts": plan["nodes"][grad_node.name].get("inputs"),
            "grad_node_output_layouts": plan["nodes"][grad_node.name]["outputs"],
            "param_layout": plan["nodes"][w_ph]["outputs"][0],
            "grad_placements": layout_to_strs(grad.placements),
            "grad_close": bool(torch.allclose(grad.full_tensor(), ref.w.grad, rtol=1e-5,
                                              atol=1e-5)),
            "loss_close": bool(torch.allclose(loss.detach(), ref_loss.detach(), rtol=1e-5)),
            "w_numel": ref.w.numel(),
            "pinned": pinned.name if pinned is not None else None,
            "report": plan.get("report", "")}


if __name__ == "__main__":
    sys.exit(run_scenarios(run))
