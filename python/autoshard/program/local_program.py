"""One rank's program: the step's forward and backward as FX graphs on local shards, with
explicit collectives (lowering.py makes it). Read by the runtime (execution.py runs it),
by the API (``parallel_gm``: joint_graph below) and by tests (``collectives``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from autoshard.program.graph_nodes import OUTSIDE, is_collective, op_name


@dataclass
class LocalProgram:
    """One rank's step: ``forward`` then ``backward`` graphs on local tensors."""

    fwd_gm: fx.GraphModule
    bwd_gm: fx.GraphModule
    n_outputs: int  # tensor outputs of the module (the rest of fwd's are saved)
    output_slots: list  # per module output: index into tensor outputs, or ("const", v)
    input_tensor_positions: list[int]  # which flat inputs (params, buffers, inputs) are tensors
    fwd: Callable = None  # what runs: fwd_gm or its compiled form
    bwd: Callable = None
    compiled: bool = False
    info: dict = field(default_factory=dict)
    # what it was lowered for in the module's state: local shapes, dtypes, devices
    # (runtime/module_runtime.py)
    state_key: tuple = ()
    split: Any = None  # deferred_tail.SplitForward of fwd, for the training step
    # at most one collective in flight (passes/in_flight.py): gloo, where waits block the host
    one_in_flight: bool = False
    # the graphs fwd / bwd run (fwd_gm / bwd_gm rewritten for the step: lower_step), before
    # any compilation
    run_fwd_gm: fx.GraphModule = None
    run_bwd_gm: fx.GraphModule = None
    # run_bwd_gm taking its inputs as one list it empties (execution._run_backward)
    boxed_bwd: fx.GraphModule = None
    bwd_unread_inputs: tuple = ()  # positions of boxed_bwd's inputs that it never reads

    def __post_init__(self):
        self.fwd = self.fwd or self.fwd_gm
        self.bwd = self.bwd or self.bwd_gm

    def collectives(self) -> list[dict]:
        """Every collective the step runs: phase, kind, joint-graph node that issued it."""
        out = []
        for phase, gm in (
            ("forward", self.run_fwd_gm or self.fwd_gm),
            ("backward", self.run_bwd_gm or self.bwd_gm),
        ):
            for n in gm.graph.nodes:
                if is_collective(n):
                    custom = n.meta.get("custom") or {}
                    src = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
                    where = custom.get("autoshard_node", OUTSIDE)
                    out.append(
                        {
                            "phase": phase,
                            "op": op_name(n).rstrip("_"),
                            "where": where,
                            # the joint-graph nodes of the collectives a fused one replaced
                            "members": custom.get("autoshard_members") or [where],
                            "numel": int(src.numel()) if src is not None else -1,
                            "node": n.name,
                        }
                    )
        return out


def foreign_devices(gm: fx.GraphModule, device: torch.device) -> list[str]:
    """Where graph ``gm`` names a device other than ``device``: device arguments of its
    calls and the devices of the tensors its nodes hold (``meta["val"]``) and its constants
    (get_attr), one line per place ("node: cuda:0"). A CPU scalar (a 0-dim tensor) is not
    counted: torch lets it meet tensors of any device. A rank's program must name only that
    rank's device: another GPU's index there allocates on (or fails against) that GPU."""
    device = torch.device(device)
    found: list[str] = []

    def visit(where: str, value: Any) -> None:
        for leaf in pytree.tree_leaves(value):
            if isinstance(leaf, torch.device):
                d = leaf
            elif isinstance(leaf, torch.Tensor) and not (leaf.dim() == 0 and leaf.is_cpu):
                d = leaf.device
            else:
                continue
            if d != device:
                found.append(f"{where}: {d}")

    for n in gm.graph.nodes:
        visit(f"{n.name} ({n.target}) argument", (n.args, n.kwargs))
        visit(f"{n.name} value", n.meta.get("val"))
        if n.op == "get_attr":
            visit(f"{n.name} constant", getattr(gm, n.target, None))
    return found


def check_program_devices(program: LocalProgram, device: torch.device) -> None:
    """Raises RuntimeError naming every place where ``program``'s graphs (as traced and as
    they run) name a device other than ``device``, the rank's own."""
    graphs = {
        "forward": program.fwd_gm,
        "backward": program.bwd_gm,
        "forward as run": program.run_fwd_gm,
        "backward as run": program.run_bwd_gm,
    }
    problems = [
        f"{name} graph, {place}"
        for name, gm in graphs.items()
        if gm is not None
        for place in foreign_devices(gm, device)
    ]
    if problems:
        raise RuntimeError(
            f"autoshard: this rank's program (device {device}) names other devices; it would "
            f"allocate on, or fail against, another rank's device. This is a bug in "
            f"autoshard's lowering: please report it with these places: "
            + "; ".join(problems[:10])
            + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        )


def joint_graph(program: LocalProgram) -> fx.GraphModule:
    """The step as one forward + backward graph, as AutoParallel's ``parallel_gm``: the
    forward's placeholders (``primals_k``), then one ``tangents_k`` per module output; the
    forward's nodes, then the backward's (tagged ``meta["partitioner_tag"] =
    "is_backward"``, reading the forward's saved values directly); outputs: the module
    outputs, then the gradients (None where an input has none). A step with no gradient
    at all (nothing requires grad) is its forward alone, without tangents. A view of the
    two graphs the module runs (``fwd_gm`` / ``bwd_gm``), for inspection; built anew on
    each call."""
    g = fx.Graph()
    env: dict[fx.Node, Any] = {}
    fwd_nodes = [n for n in program.fwd_gm.graph.nodes if n.op != "output"]
    fwd_outs = _graph_outputs(program.fwd_gm)
    grads = _graph_outputs(program.bwd_gm)
    backward = any(isinstance(o, fx.Node) for o in grads)
    bwd_inputs = (
        [n for n in program.bwd_gm.graph.nodes if n.op == "placeholder"] if backward else []
    )
    n_saved = len(fwd_outs) - program.n_outputs
    # placeholders named as in AOTAutograd's joint graph (primals_k, tangents_k)
    for k, n in enumerate(n for n in fwd_nodes if n.op == "placeholder"):
        env[n] = g.placeholder(f"primals_{k + 1}")
        env[n].meta = dict(n.meta)
    for k, ph in enumerate(bwd_inputs[n_saved:]):
        env[ph] = g.placeholder(f"tangents_{k + 1}")
        env[ph].meta = {key: v for key, v in ph.meta.items() if key != "custom"}
    for n in (n for n in fwd_nodes if n.op != "placeholder"):
        env[n] = g.node_copy(n, lambda a: env[a])
    for ph, saved in zip(bwd_inputs[:n_saved], fwd_outs[program.n_outputs :]):
        env[ph] = env[saved] if isinstance(saved, fx.Node) else saved
    for n in program.bwd_gm.graph.nodes if backward else ():
        if n.op in ("placeholder", "output"):
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
        env[n].meta["partitioner_tag"] = "is_backward"
    outs = fwd_outs[: program.n_outputs] + (grads if backward else [])
    g.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outs))
    # constants (get_attr) of both graphs on one root, under names unique in it
    root = torch.nn.Module()
    for gm in (program.fwd_gm, program.bwd_gm) if backward else (program.fwd_gm,):
        for n in (n for n in gm.graph.nodes if n.op == "get_attr"):
            name = n.target.replace(".", "_")
            while hasattr(root, name):
                name += "_"
            setattr(root, name, functools.reduce(getattr, n.target.split("."), gm))
            env[n].target = name
    return fx.GraphModule(root, g)


def copy_graph_module(gm: fx.GraphModule, boxed: bool = False) -> fx.GraphModule:
    """A copy of ``gm`` (its own graph, the same attributes). ``boxed``: the copy is called
    with one list of its inputs, which it empties as it reads it (torch.fx's boxed calling
    convention: the caller keeps no reference to the inputs, so each is freed after its last
    use in the graph)."""
    from torch.fx.graph import _BoxedCodeGen

    g = fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    if boxed:
        g.set_codegen(_BoxedCodeGen())
    return fx.GraphModule(gm, g)


def _graph_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    args = out.args[0]
    return list(args) if isinstance(args, (tuple, list)) else [args]
