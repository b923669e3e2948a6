"""Block-trace extrapolation: trace a deep model with 3 and 4 of its repeated layers and build
the N-layer joint graph from the 3-layer one.

Tracing costs time per node (Dynamo, the AOT metadata pass, the joint trace), and a transformer
is the same block N times: Llama-3-8B's 32 layers take ~12 s to trace, almost all of it the
same layer again. Here the model's repeated-layer container (``layers``) is shortened to its
first 3 members and traced; in that graph the three layer instances B0, B1, B2 are found
(parameters, forward nodes and backward nodes, by their module paths) and the N-layer graph is
built as a full trace would order it: B0, N-2 copies of the middle block B1, B2, every copy's
references into the previous / next block moved to the previous / next copy.

Nothing is trusted unchecked: every time, the 3-layer graph is also extrapolated to 4 layers
and compared node for node (names, ops, arguments, metadata, aliasing of the fake values and
every field of TracedStep) with a real trace of the container shortened to its LAST 4 members
(so a layer that behaves differently at the far end of the stack shows up too). Any
difference, or anything this module does not understand, logs one line and the caller traces
the whole model as before. What differs between layers in metadata (module paths
``layers.7.attention``, Dynamo's counters ``linear_43``, ``seq_nr``) is extrapolated as an
affine function of the layer index, fitted on B0, B1, B2 (three points: a non-affine value
fails the fit). Values of layers nodes (``meta["val"]``) are recomputed by running each op on
fake tensors, so that views alias exactly the tensors they alias in a real trace.

Known gaps: ``TracedStep.joint_with_descriptors`` (torch's AOT state, 3 layers deep) is None
for an extrapolated step, and ``meta["from_node"]`` (torch's provenance through Dynamo's graph,
which autoshard does not read) is dropped. What no trace of 3 and 4 layers can show is not
checked: a forward that runs only some of the container's members when it holds all of them
(``self.layers[:cfg.n]`` with n smaller than the list), or one that treats a layer in the
middle of a long stack differently by its index (the ends are checked). A mixed-precision
policy's casts (no module path) belong to the layer whose parameter or gradient they cast;
they all run before the layers, so each layer's seq_nr and Dynamo names also grow with the
depth, by what layer 0's nodes move from 3 to 4 layers. The forward-only step's placeholders
(named by position, arg7_1) are renumbered. Tensor constants a
layer reads (``get_attr`` of ``_tensor_constantK``: transformers' decoder layers hold two empty
ones each) must be equal in B0, B1 and B2; every copy reads the same tensor under the name a
full trace gives it (K affine in the layer index). Turn the
extrapolation off with ``trace_training_step(..., extrapolate_layers=False)`` or
AUTOSHARD_TRACE_ALL_LAYERS=1.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
import time
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.trace.traced_step import GraphOutput, TracedStep

log = logging.getLogger("autoshard")

# Below this many members the saving (N - 4 layers not traced, minus the checking) is small.
MIN_LAYERS = 6
ENV_TRACE_ALL = "AUTOSHARD_TRACE_ALL_LAYERS"
# meta keys the planner never reads and a full trace cannot be matched on: torch's provenance
# records hold ids of Dynamo's intermediate graphs
_DROPPED_META = ("from_node",)
# a module-stack key that is a module's id, spelled by path while fitting (ids are not affine)
_MODULE = "\0module:"


class _Fallback(Exception):
    """Extrapolation does not apply; the message says why (logged, then the full trace)."""


# ---------------------------------------------------------------------------------------------
# the repeated-layer container


def find_layer_container(model: nn.Module) -> tuple[str, nn.Module] | None:
    """(path, container) of the ModuleList / Sequential with the most members that are
    interchangeable: the same class, the same parameter and buffer names, shapes, dtypes and
    requires_grad, the same attributes in every submodule (except an int that counts the layer,
    like transformers' ``layer_idx``), hooks included, and no tensor shared with another
    member or the rest of the model (tied weights would not be a per-layer placeholder)."""
    best = None
    for path, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(mod) < 3:
            continue
        if list(mod._modules) != [str(i) for i in range(len(mod))]:
            continue  # named children: the parameter names would hold no index
        if best is not None and len(mod) <= len(best[1]):
            continue
        if _interchangeable(model, path, list(mod._modules.values())):
            best = (path, mod)
    return best


def _interchangeable(model: nn.Module, path: str, members: list) -> bool:
    if any(m is None for m in members) or len({id(m) for m in members}) != len(members):
        return False
    if len({type(m) for m in members}) != 1:
        return False
    sigs = [_signature(m) for m in members]
    if any(s != sigs[0] for s in sigs[1:]):
        return False
    states = [_attribute_states(m) for m in members]
    for key in states[0]:
        values = [s.get(key, _MISSING) for s in states]
        if all(_same(values[0], v) for v in values[1:]):
            continue
        # an int counting the layers (layer_idx = i + c) is allowed: the 4-layer check traces
        # the LAST members, so a forward that reads it shows up as a difference
        if all(type(v) is int for v in values) and all(
            v - values[0] == i for i, v in enumerate(values)
        ):
            continue
        return False
    # no tensor of a member is shared with another member or the rest of the model
    owner: dict[int, int] = {}
    for i, m in enumerate(members):
        for _, t in list(m.named_parameters(remove_duplicate=False)) + list(
            m.named_buffers(remove_duplicate=False)
        ):
            if owner.setdefault(id(t), i) != i:
                return False
    prefix = path + "." if path else ""
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(
        model.named_buffers(remove_duplicate=False)
    ):
        if not name.startswith(prefix) and id(t) in owner:
            return False
    return True


_MISSING = object()


def _signature(m: nn.Module) -> list:
    sig = [(n, type(s)) for n, s in m.named_modules(remove_duplicate=False)]
    for n, p in m.named_parameters(remove_duplicate=False):
        sig.append(("p", n, tuple(p.shape), p.stride(), p.dtype, p.requires_grad))
    for n, b in m.named_buffers(remove_duplicate=False):
        sig.append(("b", n, tuple(b.shape), b.stride(), b.dtype))
    return sig


def _attribute_states(m: nn.Module) -> dict:
    """(submodule path, attribute) -> value of every plain attribute (hooks, flags, sizes)."""
    state = {}
    for sub_path, sub in m.named_modules(remove_duplicate=False):
        for k, v in sub.__dict__.items():
            if k not in ("_parameters", "_buffers", "_modules"):
                state[(sub_path, k)] = v
    return state


def _same(a: Any, b: Any) -> bool:
    """Equality that never asks a tensor (or anything odd) for truth."""
    if a is b:
        return True
    if type(a) is not type(b) or isinstance(a, torch.Tensor):
        return False
    if isinstance(a, torch._ops.OpOverload):  # torch may hold two objects of one overload
        return str(a) == str(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            _same(ka, kb) and _same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items())
        )
    try:
        eq = a == b
    except Exception:
        return False
    return eq if isinstance(eq, bool) else False


# ---------------------------------------------------------------------------------------------
# entry point


def trace_by_blocks(
    fake: nn.Module,
    fake_mode,
    trace_fn: Callable[[], Any],
    run_fn: Callable[[Any], Any],
    min_layers: int = MIN_LAYERS,
):
    """The extrapolated TracedStep of ``fake`` (the fake copy tracer.py traces), or None when
    the model has no repeated layers to extrapolate or anything fails: then the caller traces
    the whole model. ``trace_fn()`` traces ``fake`` as it is at the call; ``run_fn(mode)``
    runs the whole fake model's forward once, eagerly, with the dispatch mode ``mode``
    entered inside the fake mode (layers_run_alike)."""
    if os.environ.get(ENV_TRACE_ALL, "") not in ("", "0"):
        return None
    found = find_layer_container(fake)
    if found is None or len(found[1]) < min_layers:
        return None
    path, container = found
    members = list(container._modules.values())
    n = len(members)
    t0 = time.perf_counter()
    try:
        layers_run_alike(members, run_fn)
        eager_s = time.perf_counter() - t0
        times = [time.perf_counter()]
        k3 = _traced_with(fake, path, container, members[:3], trace_fn)
        layout = _Layout(k3, path, 3)  # checks B0, B1, B2 before paying for the 4-layer trace
        times.append(time.perf_counter())
        k4 = _traced_with(fake, path, container, members[-4:], trace_fn)
        layout4 = _Layout(k4, path, 4)
        shared4 = layout4.shared_nodes()
        first4 = layout4.layer_nodes(0)
        times.append(time.perf_counter())
        coords3 = _Coords(fake, path, container, members[:3])
        check = _extrapolate(
            k3, layout, shared4, first4, 4, coords3, _Coords(fake, path, container, members[-4:])
        )
        diff = first_difference(check, k4)
        if diff is not None:
            raise _Fallback(
                f"the 3-layer trace extrapolated to 4 layers differs from the "
                f"4-layer trace: {diff}"
            )
        times.append(time.perf_counter())
        step = _extrapolate(
            k3, layout, shared4, first4, n, coords3, _Coords(fake, path, container, members)
        )
        times.append(time.perf_counter())
        log.debug(
            "autoshard: trace_blocks: eager pass %.2f s, 3 layers %.2f s, 4 layers %.2f s, "
            "check %.2f s, %d layers %.2f s",
            eager_s,
            *(b - a for a, b in zip(times[:3], times[1:3])),
            times[3] - times[2],
            n,
            times[4] - times[3],
        )
    except _Fallback as e:
        log.info("autoshard: tracing all %d layers of %s: %s", n, path, e)
        return None
    except Exception as e:  # a shortened model that does not trace, or a bug here
        log.info(
            "autoshard: tracing all %d layers of %s: %s: %s",
            n,
            path,
            type(e).__name__,
            (str(e).splitlines() or [""])[0][:200],
        )
        return None
    log.info(
        "autoshard: traced 3 and 4 of %d layers of %s, extrapolated (%.1f s)",
        n,
        path,
        time.perf_counter() - t0,
    )
    return step


def layers_run_alike(members: list, run_fn: Callable[[Any], Any]) -> None:
    """Raises _Fallback unless the whole model's forward runs every layer once, in order, and
    every layer runs the same ATen ops on the same shapes and constants. The traces of 3 and 4
    layers cannot see the layers between (a forward that runs ``layers[:n]`` with n short of
    the list, or one that branches on a layer's index in the middle of the stack); one eager
    pass over the fake model does, for about a tenth of a full trace."""
    calls: list[int] = []
    ops: list[list] = [[] for _ in members]
    current: list[int] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if current:
                ops[current[-1]].append((str(func), _op_signature((args, kwargs or {}))))
            return func(*args, **(kwargs or {}))

    def enter(i):
        def hook(module, args, kwargs=None):
            calls.append(i)
            current.append(i)

        return hook

    def leave(module, args, output):
        current.pop()

    handles = []
    for i, m in enumerate(members):
        handles.append(m.register_forward_pre_hook(enter(i)))
        handles.append(m.register_forward_hook(leave, always_call=True))
    try:
        run_fn(Recorder())
    finally:
        for h in handles:
            h.remove()
    if calls != list(range(len(members))):
        shown = calls[:12] + (["..."] if len(calls) > 12 else [])
        raise _Fallback(
            f"the forward does not run each of the {len(members)} layers once in "
            f"order (it runs {shown})"
        )
    for i in range(1, len(members)):
        if ops[i] != ops[0]:
            k = next(
                (j for j, (a, b) in enumerate(zip(ops[0], ops[i])) if a != b),
                min(len(ops[0]), len(ops[i])),
            )
            raise _Fallback(f"layer {i}'s forward differs from layer 0's at its op {k}")


def _op_signature(v: Any) -> Any:
    """What an op's arguments look like, comparable across layers: tensors by shape, stride
    and dtype, plain values as they are, anything else by type."""
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), tuple(v.stride()), v.dtype)
    if isinstance(v, (list, tuple)):
        return tuple(_op_signature(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _op_signature(x)) for k, x in v.items())
    if v is None or isinstance(v, (bool, int, float, complex, str)):
        return v
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(v)
    return type(v).__name__


def _traced_with(
    fake: nn.Module, path: str, container: nn.Module, members: list, trace_fn: Callable[[], Any]
):
    """``trace_fn()`` with ``fake``'s container holding just ``members`` (a shallow copy of it,
    so its class and attributes stay; models that slice ``self.layers[:n]`` still run)."""
    short = copy.copy(container)
    short.__dict__["_modules"] = {str(i): m for i, m in enumerate(members)}
    parent_path, _, name = path.rpartition(".")
    parent = fake.get_submodule(parent_path)
    parent._modules[name] = short
    try:
        return trace_fn()
    finally:
        parent._modules[name] = container


class _Coords:
    """Module ids <-> paths of the fake model with the container holding ``members``
    (nn_module_stack keys are ``str(id(module))``)."""

    def __init__(self, fake, path, container, members):
        self.path_of: dict[str, str] = {}
        self.id_of: dict[str, str] = {}
        prefix = path + "."
        for name, mod in fake.named_modules(remove_duplicate=False):
            if name == path or name.startswith(prefix):
                continue
            self._add(name, mod)
        self._add(path, container)
        for i, m in enumerate(members):
            for sub, mod in m.named_modules(remove_duplicate=False):
                self._add(f"{prefix}{i}" + (f".{sub}" if sub else ""), mod)

    def _add(self, name, mod):
        self.path_of.setdefault(str(id(mod)), name)
        self.id_of.setdefault(name, str(id(mod)))


# ---------------------------------------------------------------------------------------------
# the three layer instances of the 3-layer graph


_NAME = re.compile(r"(.*)_(\d+)")


def _is_policy_cast(node: fx.Node) -> bool:
    """A dtype cast made by mixed_precision.CastingStep outside any module (a parameter to
    param_dtype, a gradient to reduce_dtype): an empty module stack, like the model's own
    top-level code, but it belongs to the layer of what it casts."""
    return node.target is torch.ops.aten._to_copy.default and not any(
        node.meta.get(k) for k in _STACKS
    )


def _split_name(name: str) -> tuple[str, int]:
    m = _NAME.fullmatch(name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


# an inference graph's placeholders (the forward-only step) are named by position: arg7_1
_POSITIONAL = re.compile(r"arg(\d+)_1")


def _name_base(node: fx.Node) -> str:
    if node.op == "placeholder" and _POSITIONAL.fullmatch(node.name):
        return "arg"
    return _split_name(node.name)[0]


class _Layout:
    """Which layer (0..k-1, or None: shared) each node belongs to, and the graph as runs.

    A node belongs to layer i if its module path (nn_module_stack; backward nodes carry their
    forward node's as fwd_nn_module_stack) is inside ``<container>.i``; a placeholder if its
    parameter or buffer is. In a 3-layer graph the layer nodes must come as groups of three
    equally long runs, layers 0, 1, 2 (forward, parameters) or 2, 1, 0 (backward), with the
    nodes of a group's runs matching position for position: that position is how B0's, B1's
    and B2's nodes correspond."""

    def __init__(self, step, path: str, k: int):
        self.step = step
        self.k = k
        graph = step.gm.graph
        self.nodes = list(graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        from autoshard.user_frames import dotted_module_path

        esc = re.escape(path)
        # "inner." is mixed_precision.CastingStep's attribute holding the user's model
        in_layer = re.compile(rf"(?:inner\.)?{esc}\.(\d+)(?:\.|$)")
        fqn_layer = re.compile(rf"{esc}\.(\d+)\.")
        fqns = {**step.param_fqns, **step.buffer_fqns}
        self.label: dict[fx.Node, int | None] = {}
        unknown = []  # nodes without a module stack (the model's own code has an empty one)
        for node in self.nodes:
            found = set()
            if node.op == "call_function" and (
                not any(k in node.meta for k in _STACKS) or _is_policy_cast(node)
            ):
                unknown.append(node)
                continue
            if node.op == "placeholder":
                m = fqn_layer.match(fqns.get(node.name, ""))
                if m:
                    found.add(int(m.group(1)))
            elif node.op != "output":
                stack = (
                    node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
                )
                for p, _ in stack.values():
                    m = in_layer.match(dotted_module_path(p) or "")
                    if m:
                        found.add(int(m.group(1)))
                if node.op not in ("call_function", "get_attr") and found:
                    raise _Fallback(f"layer node {node.name} is a {node.op}")
            if len(found) > 1:
                raise _Fallback(f"node {node.name} is in layers {sorted(found)}")
            lab = found.pop() if found else None
            if lab is not None and not 0 <= lab < k:
                raise _Fallback(f"node {node.name} in layer {lab} of {k}")
            self.label[node] = lab
        # Autograd's gradient sums (a tensor read twice) carry no module stack: such a node
        # belongs to the layer all its inputs belong to, else to the layer of the nodes around
        # it if both are in the same one (the checks below and the comparison with the 4-layer
        # trace catch a wrong guess)
        before, after = {}, {}
        last = None
        for node in self.nodes:
            before[node] = last
            if node in self.label:
                last = self.label[node]
        last = None
        for node in reversed(self.nodes):
            after[node] = last
            if node in self.label:
                last = self.label[node]
        for node in unknown:
            labels = {self.label[u] for u in node.all_input_nodes}
            if len(labels) == 1:
                self.label[node] = labels.pop()
            elif before[node] is not None and before[node] == after[node]:
                self.label[node] = before[node]
            else:
                self.label[node] = None
        if k == 3:
            self._group()

    def shared_nodes(self) -> list:
        return self.layer_nodes(None)

    def layer_nodes(self, layer: int | None) -> list:
        """The nodes of one layer (None: the shared ones), in graph order."""
        return [n for n in self.nodes if self.label[n] == layer]

    def _group(self):
        """Runs -> segments: ("shared", node) or ("group", g) with self.groups[g] =
        (direction, [run0, run1, run2])."""
        runs = _runs(self.nodes, self.label)
        self.segments: list = []
        self.groups: list = []
        self.where: dict[fx.Node, tuple[int, int, int]] = {}  # node -> (group, block, position)
        self.groups, self.segments = _group_runs(runs, lambda n: n.name, allow_own_b0=True)
        for g, (_, blocks, _) in enumerate(self.groups):
            for b, run in enumerate(blocks):
                for i, node in enumerate(run):
                    self.where[node] = (g, b, i)
        if not self.groups:
            raise _Fallback("no node of the layers found (no module paths?)")
        own_b0 = set()  # nodes of B0 runs with no counterpart in B1 (see _group_runs)
        for g, (_, blocks, same0) in enumerate(self.groups):
            first = 0 if same0 else 1
            if not same0:
                own_b0.update(blocks[0])
            for i, nodes in enumerate(zip(*blocks[first:])):
                _check_triple(list(enumerate(nodes, first)), self)
        for node in self.nodes:  # a copy of B1 or B2 could not tell which node to read
            if self.label[node] in (1, 2) and any(u in own_b0 for u in node.all_input_nodes):
                raise _Fallback(f"{node.name} reads a node of layer 0 unlike the other layers")

    def fit_points(self, t: fx.Node) -> tuple[list, tuple]:
        """The nodes (and their layers) that the copies of layer node ``t`` are fitted on:
        the three layers' nodes at its position, or, in a group whose B0 run is its own,
        B1's and B2's (B0's nodes stand for layer 0 alone)."""
        g, b, i = self.where[t]
        _, blocks, same0 = self.groups[g]
        if same0:
            return [blocks[0][i], blocks[1][i], blocks[2][i]], (0, 1, 2)
        if b == 0:
            return [t], (0,)
        return [blocks[1][i], blocks[2][i]], (1, 2)


def _runs(items: list, label) -> list[tuple[Any, list]]:
    runs: list[tuple[Any, list]] = []
    for x in items:
        lab = label[x] if isinstance(label, dict) else label(x)
        if runs and runs[-1][0] == lab:
            runs[-1][1].append(x)
        else:
            runs.append((lab, [x]))
    return runs


def _group_runs(runs: list, describe: Callable, allow_own_b0: bool = False) -> tuple[list, list]:
    """Layer runs in threes: 0, 1, 2 (ascending) or 2, 1, 0 (descending), equally long; with
    ``allow_own_b0`` layer 0's may differ (the first layer's backward computes no gradient
    for its input when that needs none): groups are (direction, runs, whether B0 matches)."""
    groups, segments = [], []
    j = 0
    while j < len(runs):
        lab, items = runs[j]
        if lab is None:
            segments.extend(("shared", x) for x in items)
            j += 1
            continue
        labs = [r[0] for r in runs[j : j + 3]]
        if labs not in ([0, 1, 2], [2, 1, 0]):
            raise _Fallback(
                f"the layers' nodes are interleaved near {describe(items[0])} " f"(layers {labs})"
            )
        blocks = [runs[j + labs.index(b)][1] for b in range(3)]
        same0 = len(blocks[0]) == len(blocks[1])
        if len(blocks[1]) != len(blocks[2]) or not (same0 or allow_own_b0):
            raise _Fallback(
                f"the layers differ in node count near {describe(items[0])} "
                f"({[len(r) for r in blocks]})"
            )
        segments.append(("group", len(groups)))
        groups.append((+1 if labs[0] == 0 else -1, blocks, same0))
        j += 3
    return groups, segments


def _check_triple(triple: list, layout: _Layout) -> None:
    """B0's, B1's and B2's nodes at one position, as (layer, node): the same op on the same
    constants, and references only to the same, the previous or the next layer, or to shared
    nodes."""
    t0 = triple[0][1]
    for b, t in triple:
        if t.op == "get_attr" and t0.op == "get_attr":
            _check_same_constant(t0, t, layout.step.gm)
        elif (
            t.op != t0.op
            or (t.op != "placeholder" and not _same(t.target, t0.target))
            or (_name_base(t) != _name_base(t0))
        ):
            raise _Fallback(f"layers differ: {t0.name} ({t0.target}) vs {t.name} ({t.target})")
        if _constants(t) != _constants(t0):
            raise _Fallback(
                f"layers differ in the arguments of {t0.name} vs {t.name} "
                f"(the layer index used as a constant?)"
            )
        for u in t.all_input_nodes:
            c = layout.label[u]
            if c is not None and c - b not in (-1, 0, 1):
                raise _Fallback(f"{t.name} in layer {b} reads {u.name} of layer {c}")


_CONSTANT = re.compile(r"_tensor_constant(\d+)")


def _check_same_constant(t0: fx.Node, t: fx.Node, gm: fx.GraphModule) -> None:
    """Two layers' get_attr nodes at one position: tensor constants named as the trace names
    them (so their copies can be named by an affine fit), with equal values."""
    for x in (t0, t):
        if not (_CONSTANT.fullmatch(str(x.target)) and x.name == x.target):
            raise _Fallback(f"layer node {x.name} reads the attribute {x.target}")
    a, b = getattr(gm, t0.target), getattr(gm, t.target)
    if not (
        type(a) is torch.Tensor
        and type(b) is torch.Tensor
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.device == b.device
        and a.device.type != "meta"
        and torch.equal(a, b)
    ):
        raise _Fallback(f"layers read different constants: {t0.target} vs {t.target}")


def _constant_target(t: fx.Node, L: int, layout: "_Layout") -> str:
    """The name a full trace gives layer L's copy of the tensor constant ``t`` reads."""
    points, xs = layout.fit_points(t)
    k = _fit(
        [int(_CONSTANT.fullmatch(u.target).group(1)) for u in points],
        xs,
        f"the number of {t.target}",
    ).at(L)
    return f"_tensor_constant{k}"


def _constants(node: fx.Node) -> str:
    return repr(fx.node.map_arg((node.args, node.kwargs), lambda _: None))


# ---------------------------------------------------------------------------------------------
# affine fits of metadata across layers


class _Const:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    def at(self, x):
        return _fresh(self.v)


def _fresh(v):
    # a node's meta containers are its own (passes may edit them in place)
    if type(v) is dict:
        return {k: _fresh(x) for k, x in v.items()}
    if type(v) is list:
        return [_fresh(x) for x in v]
    return v


class _Lin:
    __slots__ = ("v0", "x0", "slope")

    def __init__(self, v0, x0, slope):
        self.v0, self.x0, self.slope = v0, x0, slope

    def at(self, x):
        return self.v0 + (x - self.x0) * self.slope


class _Str:
    __slots__ = ("parts",)

    def __init__(self, parts):
        self.parts = parts

    def at(self, x):
        return "".join(p if isinstance(p, str) else str(p.at(x)) for p in self.parts)


class _Name:
    __slots__ = ("base", "num")

    def __init__(self, base, num):
        self.base, self.num = base, num

    def at(self, x):
        k = self.num.at(x)
        return f"{self.base}_{k}" if k else self.base


class _Seq:
    __slots__ = ("make", "items")

    def __init__(self, make, items):
        self.make, self.items = make, items

    def at(self, x):
        return self.make([f.at(x) for f in self.items])


class _Dict:
    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items

    def at(self, x):
        return {k.at(x): v.at(x) for k, v in self.items}


class _Obj:
    __slots__ = ("cls", "fields")

    def __init__(self, cls, fields):
        self.cls, self.fields = cls, fields

    def at(self, x):
        obj = object.__new__(self.cls)  # frozen dataclasses: set the fields as __init__ would
        for name, f in self.fields:
            object.__setattr__(obj, name, f.at(x))
        return obj


_DIGITS = re.compile(r"(\d+)")


def _fit(values: list, xs: tuple, what: str):
    """A value at layer x, fitted on ``values`` at ``xs``: equal values stay, ints and the
    numbers inside strings must be affine in x (``layers.7``, ``linear_43``)."""
    v0 = values[0]
    if all(_same(v0, v) for v in values[1:]):
        return _Const(v0)
    t = type(v0)
    if any(type(v) is not t for v in values):
        raise _Fallback(f"{what} differs in type across layers")
    if t is int:
        slope, rem = divmod(values[1] - v0, xs[1] - xs[0])
        if rem or any(v != v0 + (x - xs[0]) * slope for v, x in zip(values, xs)):
            raise _Fallback(f"{what} is not affine in the layer index ({values})")
        return _Lin(v0, xs[0], slope)
    if t is str:
        split = [_DIGITS.split(v) for v in values]
        if any(len(s) != len(split[0]) for s in split):
            # FX names: the first of a base has no number (``mean``, ``mean_2``, ``mean_4``)
            names = [_split_name(v) for v in values]
            if any(b != names[0][0] for b, _ in names):
                raise _Fallback(f"{what} differs across layers ({values})")
            return _Name(names[0][0], _fit([k for _, k in names], xs, what))
        parts = []
        for j, tokens in enumerate(zip(*split)):
            if j % 2 == 0:
                if any(tok != tokens[0] for tok in tokens):
                    raise _Fallback(f"{what} differs across layers ({values})")
                parts.append(tokens[0])
            elif all(tok == tokens[0] for tok in tokens):
                parts.append(tokens[0])
            elif any(len(tok) > 1 and tok[0] == "0" for tok in tokens):
                raise _Fallback(f"{what} has zero-padded numbers ({values})")
            else:
                parts.append(_fit([int(tok) for tok in tokens], xs, what))
        return _Str(parts)
    if isinstance(v0, (list, tuple)):
        if any(len(v) != len(v0) for v in values):
            raise _Fallback(f"{what} differs in length across layers")
        make = t._make if hasattr(t, "_make") else t
        return _Seq(make, [_fit(list(e), xs, what) for e in zip(*values)])
    if t is dict:
        if any(len(v) != len(v0) for v in values):
            raise _Fallback(f"{what} differs in length across layers")
        return _Dict(
            [
                (_fit(list(k), xs, what), _fit(list(v), xs, what))
                for k, v in zip(
                    zip(*(v.keys() for v in values)), zip(*(v.values() for v in values))
                )
            ]
        )
    if dataclasses.is_dataclass(v0) and not isinstance(v0, type):
        names = [f.name for f in dataclasses.fields(v0)]
        return _Obj(
            t, [(name, _fit([getattr(v, name) for v in values], xs, what)) for name in names]
        )
    raise _Fallback(f"{what} differs across layers ({type(v0).__name__})")


_STACKS = ("nn_module_stack", "fwd_nn_module_stack")


def _symbolic_meta(node: fx.Node, coords: _Coords) -> dict:
    """node.meta without the keys recomputed or dropped, module ids spelled by path."""
    meta = {}
    for key, v in node.meta.items():
        if key == "val" or key in _DROPPED_META:
            continue
        if key in _STACKS and isinstance(v, dict):
            v = {
                (_MODULE + coords.path_of[k]) if k in coords.path_of else k: p for k, p in v.items()
            }
        meta[key] = v
    return meta


def _concrete_meta(meta: dict, coords: _Coords, what: str) -> dict:
    for key in _STACKS:
        stack = meta.get(key)
        if isinstance(stack, dict):
            out = {}
            for k, p in stack.items():
                if isinstance(k, str) and k.startswith(_MODULE):
                    mid = coords.id_of.get(k[len(_MODULE) :])
                    if mid is None:
                        raise _Fallback(f"{what}: no module {k[len(_MODULE):]}")
                    k = mid
                out[k] = p
            meta[key] = out
    return meta


class _MetaFit:
    """The metadata of one node of the N-layer graph as a function of its layer."""

    def __init__(self, metas: list[dict], xs: tuple, what: str):
        keys = list(metas[0])
        if any(list(m) != keys for m in metas[1:]):
            raise _Fallback(f"{what}: metadata keys differ across layers")
        self.fits = [(k, _fit([m[k] for m in metas], xs, f"{what} meta {k!r}")) for k in keys]
        self.by_key = dict(self.fits)

    def at(self, x) -> dict:
        return {k: f.at(x) for k, f in self.fits}


# ---------------------------------------------------------------------------------------------
# building the N-layer step


def _extrapolate(
    k3, layout: _Layout, shared4: list, first4: list, n: int, coords3: _Coords, target: _Coords
):
    """The TracedStep of ``n`` layers built from the 3-layer one (module ids of ``target``)."""
    # bases no layer node has: their nodes keep their names (placeholders are renumbered:
    # the layers' parameters come first)
    kept = _shared_bases(layout.nodes, lambda x: layout.label[x] is None)
    nodes4 = list(shared4[0].graph.nodes)
    in_shared4 = set(shared4)
    if kept != _shared_bases(nodes4, lambda x: x in in_shared4):
        raise _Fallback("the layers hold other kinds of nodes with 3 and 4 layers")
    skips = _name_skips(layout.nodes, "3-layer", kept)
    _name_skips(nodes4, "4-layer", kept)
    shared3 = layout.shared_nodes()
    if len(shared3) != len(shared4):
        raise _Fallback(f"{len(shared3)} shared nodes with 3 layers, {len(shared4)} with 4")
    twin = {}  # shared node of the 3-layer graph -> the same node of the 4-layer graph
    for a, b in zip(shared3, shared4):
        if a.op != b.op or (
            a.op not in ("placeholder", "output")
            and (not _same(a.target, b.target) or _constants(a) != _constants(b))
        ):
            raise _Fallback(
                f"shared node {a.name} ({a.target}) with 3 layers is "
                f"{b.name} ({b.target}) with 4"
            )
        twin[a] = b
    base3 = _seq_base(layout.nodes)
    base4 = _seq_base(list(shared4[0].graph.nodes))
    seq_of = _shared_seq_nrs(twin, base3, base4, n)
    depth_shift = _depth_shifts(layout, first4, base3, base4)

    # the new graph's order: shared nodes where they are, each group's runs unrolled
    order: list[tuple[fx.Node, int | None]] = []  # (template node, layer or None)
    for kind, x in layout.segments:
        if kind == "shared":
            order.append((x, None))
            continue
        direction, blocks, _ = layout.groups[x]
        layers = range(n) if direction > 0 else range(n - 1, -1, -1)
        for L in layers:
            b = 0 if L == 0 else (2 if L == n - 1 else 1)
            order.extend((t, L) for t in blocks[b])

    fake_mode = k3.fake_mode
    recipes = _value_recipes(layout.nodes)
    graph = fx.Graph()
    new: dict[tuple, fx.Node] = {}  # ("s", node) or (group, position, layer) -> new node
    counters: dict[str, int] = {}
    starts = _name_starts(layout.nodes)
    meta_fits: dict[fx.Node, _MetaFit] = {}

    def key_of(u: fx.Node, b: int | None, L: int | None) -> tuple:
        """The new node a template node's reference to ``u`` becomes, seen from layer L (an
        instance of block b) or from a shared node (b None)."""
        c = layout.label[u]
        if c is None:
            return ("s", u)
        g, _, i = layout.where[u]
        if b is None:
            if c == 1:
                raise _Fallback(f"a shared node reads {u.name} of a middle layer")
            return (g, i, 0 if c == 0 else n - 1)
        if abs(c - b) > 1:
            raise _Fallback(f"a node of layer {b} reads {u.name} of layer {c}")
        return (g, i, L + (c - b))

    def resolve(u, b, L):
        key = key_of(u, b, L)
        if key not in new:
            raise _Fallback(f"{u.name} is read before it is computed in the unrolled graph")
        return new[key]

    def next_name(template: fx.Node, keep: bool) -> str:
        base, k = _split_name(template.name)
        if not keep:
            k = counters.get(base, starts[base]) + skips.get(template, 0)
        counters[base] = k + 1
        return f"{base}_{k}" if k else base

    out_template = None
    constants: dict[str, torch.Tensor] = {}  # layer copies' get_attr targets -> tensor
    placeholders = 0
    for t, L in order:
        b = None if L is None else layout.where[t][1]
        if t.op == "output":
            out_template = (t, L)
            continue
        if t.op == "placeholder" and _POSITIONAL.fullmatch(t.name):
            name = f"arg{placeholders}_1"
        elif t.op == "get_attr" and L is not None:
            name = _constant_target(t, L, layout)
        else:
            name = next_name(t, _split_name(t.name)[0] in kept)
        placeholders += t.op == "placeholder"
        if t.op == "get_attr" and L is not None:  # every copy reads B0's equal constant
            constants[name] = getattr(k3.gm, t.target)
            node = graph.get_attr(name)
        elif t.op == "placeholder":
            if t.target != t.name:
                raise _Fallback(f"placeholder {t.name} has target {t.target}")
            node = graph.placeholder(name)
        else:
            args, kwargs = fx.node.map_arg((t.args, t.kwargs), lambda u: resolve(u, b, L))
            node = graph.create_node(t.op, t.target, args, kwargs, name=name)
        if node.name != name:
            raise _Fallback(f"fx named {name} {node.name}")
        meta = _node_meta(
            t, L, b, layout, meta_fits, twin, coords3, target, base3, base4, n, seq_of, depth_shift
        )
        if "val" in t.meta:
            meta["val"] = _value(t, fake_mode, recipes, lambda u: resolve(u, b, L))
        # in the template's key order (a full trace's)
        node.meta = {k: meta[k] for k in t.meta if k in meta}
        new[("s", t) if L is None else (layout.where[t][0], layout.where[t][2], L)] = node

    # the output node: its flat list of values is unrolled like the nodes
    out, _ = out_template
    out_new, elem_instances = _unrolled_outputs(out, layout, k3, n)
    values = []
    for j, L, b in elem_instances:
        v = out.args[0][j]
        values.append(fx.node.map_arg(v, lambda u: resolve(u, b, L)))
    out_node = graph.output(
        type(out.args[0])(values)
        if not isinstance(out.args[0], fx.immutable_collections.immutable_list)
        else values
    )
    out_node.meta = _output_meta(out, twin, elem_instances, layout, base3, base4, n)

    # the pytree calling convention (flat lists of placeholders / outputs)
    graph._codegen = _unrolled_codegen(k3.gm.graph._codegen, layout, order, out, elem_instances)
    for name, value in constants.items():  # k3 is this module's own trace: GraphModule copies
        setattr(k3.gm, name, value)  # what the graph reads from it
    gm = fx.GraphModule(k3.gm, graph)
    gm.meta = dict(k3.gm.meta)
    if hasattr(k3.gm, "shape_env"):
        gm.shape_env = k3.gm.shape_env

    # TracedStep's names
    name_of = {}  # (template name, layer) -> new name; shared: (template name, None)
    for t, L in order:
        if t.op == "output":
            continue
        key = ("s", t) if L is None else (layout.where[t][0], layout.where[t][2], L)
        name_of[(t.name, L)] = new[key].name
    by_name = {n_.name: n_ for n_ in layout.nodes}

    def fit_field(mapping: dict, what: str) -> dict:
        """A dict keyed by node name, unrolled: entries of layer nodes fitted across B0..B2."""
        result = {}
        for t, L in order:
            if t.op == "output" or t.name not in mapping:
                if L is not None and t.op != "output":
                    if any(u.name in mapping for u in layout.fit_points(t)[0]):
                        raise _Fallback(f"{what}: only some layers have {t.name}")
                continue
            if L is None:
                result[name_of[(t.name, None)]] = mapping[t.name]
            else:
                points, xs = layout.fit_points(t)
                if not all(u.name in mapping for u in points):
                    raise _Fallback(f"{what}: only some layers have {t.name}")
                f = _fit([mapping[u.name] for u in points], xs, f"{what} of {t.name}")
                result[name_of[(t.name, L)]] = f.at(L)
        return result

    param_fqns = fit_field(k3.param_fqns, "param_fqns")
    buffer_fqns = fit_field(k3.buffer_fqns, "buffer_fqns")
    local_inputs = fit_field(k3.local_inputs, "local_inputs")
    sharding_pins = fit_field(k3.sharding_pins, "sharding_pins")

    def shared_name(name):
        if name is None:
            return None
        t = by_name[name]
        if layout.label[t] is not None:
            raise _Fallback(f"{name} (a forward input or tangent) is in a layer")
        return name_of[(name, None)]

    input_nodes = [shared_name(x) for x in k3.input_nodes]
    tangent_of = {shared_name(k): v for k, v in k3.tangent_of.items()}
    outputs = []
    for (j, L, b), v in zip(elem_instances, values):
        tv = out.args[0][j]
        if not _has_entry(out.meta["desc"][j], tv):
            continue
        # the entries of one output slot repeat for each of its layers
        entry = _entry_of(k3, out, j)
        grad_of = entry.grad_of
        if grad_of is not None:
            grad_of = resolve(by_name[grad_of], b, L).name
        outputs.append(GraphOutput(v, entry.role, output_index=entry.output_index, grad_of=grad_of))
    step = TracedStep(
        gm=gm,
        fake_mode=fake_mode,
        device=k3.device,
        param_fqns=param_fqns,
        buffer_fqns=buffer_fqns,
        input_nodes=input_nodes,
        input_metas=k3.input_metas,
        input_spec=k3.input_spec,
        tangent_of=tangent_of,
        outputs=outputs,
        num_forward_outputs=k3.num_forward_outputs,
        output_spec=k3.output_spec,
        source_captured=k3.source_captured,
        local_inputs=local_inputs,
        forward_signature=k3.forward_signature,
        input_requires_grad=k3.input_requires_grad,
        joint=k3.joint,
        training=k3.training,
        sharding_pins=sharding_pins,
        joint_with_descriptors=None,
        load_balance=k3.load_balance,
    )
    _fill_remaining_fields(step, k3)
    return step


def _fill_remaining_fields(step, k3) -> None:
    """TracedStep fields added after this module was written: copied if they name no node,
    refused otherwise (so a new field is never silently wrong)."""
    known = {
        "gm",
        "fake_mode",
        "device",
        "param_fqns",
        "buffer_fqns",
        "input_nodes",
        "input_metas",
        "input_spec",
        "tangent_of",
        "outputs",
        "num_forward_outputs",
        "output_spec",
        "source_captured",
        "trace_seconds",
        "local_inputs",
        "forward_signature",
        "input_requires_grad",
        "joint",
        "training",
        "sharding_pins",
        "joint_with_descriptors",
        "load_balance",
    }
    for f in dataclasses.fields(step):
        if f.name not in known:
            raise _Fallback(f"TracedStep.{f.name} is not known to trace_blocks")


def _has_entry(desc, value) -> bool:
    """Whether tracer.py made a GraphOutput of an output slot (PlainAOTOutput always, a
    gradient if it is not None)."""
    from torch._functorch._aot_autograd.descriptors import PlainAOTOutput

    return isinstance(desc, PlainAOTOutput) or value is not None


def _entry_of(k3, out: fx.Node, j: int):
    """k3.outputs' entry of output slot j."""
    cache = getattr(k3, "_trace_blocks_entries", None)
    if cache is None:
        cache = {}
        entries = iter(k3.outputs)
        for jj, (v, d) in enumerate(zip(out.args[0], out.meta["desc"])):
            if _has_entry(d, v):
                e = next(entries)
                if e.node is not v:
                    raise _Fallback("TracedStep.outputs does not follow the output node")
                cache[jj] = e
        if next(entries, None) is not None:
            raise _Fallback("TracedStep.outputs does not follow the output node")
        object.__setattr__(k3, "_trace_blocks_entries", cache)
    return cache[j]


def _node_meta(
    t, L, b, layout, meta_fits, twin, coords3, target, base3, base4, n, seq_of, depth_shift
) -> dict:
    if L is None:
        meta = _shared_meta(t, twin[t], coords3, base3, base4, n)
    else:
        fit = meta_fits.get(t)
        if fit is None:
            points, xs = layout.fit_points(t)
            fit = _MetaFit([_symbolic_meta(u, coords3) for u in points], xs, t.name)
            for u in points:
                meta_fits[u] = fit
        meta = fit.at(L)
        seq = fit.by_key.get("seq_nr")
        if isinstance(seq, _Const) and seq.v in seq_of:
            # autograd's gradient sums take the sequence number current in the backward (the
            # last forward op's, a shared node's): it moves with the depth like that node's
            if seq_of[seq.v] is None:
                raise _Fallback(f"{t.name}: seq_nr {seq.v} is ambiguous")
            meta["seq_nr"] = seq_of[seq.v]
        elif "seq_nr" in meta:
            meta["seq_nr"] += (n - 3) * depth_shift.get(layout.where[t][::2], 0)
        for key in _COUNTED:  # Dynamo's names count on the same way
            shift = depth_shift.get((key,) + layout.where[t][::2])
            if shift and key in meta:
                meta[key] = _shift_names(meta[key], (n - 3) * shift)
    return _concrete_meta(meta, target, t.name)


def _counted_names(v) -> list | None:
    """The numbers of a source_fn_stack's names ([("to_33", "to")] -> [33]), or None."""
    if not isinstance(v, list) or not all(
        isinstance(e, tuple) and e and isinstance(e[0], str) for e in v
    ):
        return None
    return [_split_name(e[0])[1] for e in v]


def _shift_names(v: list, by: int) -> list:
    out = []
    for e in v:
        base, k = _split_name(e[0])
        out.append((f"{base}_{k + by}" if k + by else base,) + tuple(e[1:]))
    return out


def _depth_shifts(layout: _Layout, first4: list, base3: int, base4: int) -> dict:
    """(group, position) -> how much a layer node's seq_nr grows per layer the model has, and
    (key, group, position) -> the same for the numbers of Dynamo's names in meta[key].
    Autograd and Dynamo number ops in order, so a layer's numbers move with the depth when
    something per layer runs before the layers (mixed precision casts every parameter
    first). Read off layer 0's nodes with 3 and with 4 layers, position for position."""
    first3 = layout.layer_nodes(0)
    if len(first3) != len(first4):
        raise _Fallback(f"layer 0 has {len(first3)} nodes with 3 layers, {len(first4)} with 4")
    shifts: dict = {}
    by_group: dict = {}
    for a, b in zip(first3, first4):
        if a not in layout.where or "seq_nr" not in a.meta or "seq_nr" not in b.meta:
            continue
        g, _, i = layout.where[a]
        shift = (b.meta["seq_nr"] - base4) - (a.meta["seq_nr"] - base3)
        by_group.setdefault(g, set()).add(shift)
        if layout.groups[g][2]:  # B0's run matches B1's and B2's position for position
            shifts[(g, i)] = shift
            for key in _COUNTED:  # one shift for all of a node's names
                ka, kb = _counted_names(a.meta.get(key)), _counted_names(b.meta.get(key))
                if ka and kb and len(ka) == len(kb) and len({y - x for x, y in zip(ka, kb)}) == 1:
                    shifts[(key, g, i)] = kb[0] - ka[0]
    # a group whose B0 run is its own (layer 0's backward computes no input gradient) takes
    # the shift all of its B0 nodes agree on
    for g, values in by_group.items():
        if len(values) == 1:
            for i in range(len(layout.groups[g][1][1])):
                shifts.setdefault((g, i), next(iter(values)))
    return shifts


def _shared_seq_nrs(twin: dict, base3: int, base4: int, n: int) -> dict:
    """seq_nr of a shared node with 3 layers -> with n (None: two nodes disagree)."""
    seq_of: dict = {}
    for a, b in twin.items():
        if "seq_nr" in a.meta and "seq_nr" in b.meta:
            rel3, rel4 = a.meta["seq_nr"] - base3, b.meta["seq_nr"] - base4
            new = base3 + rel3 + (n - 3) * (rel4 - rel3)
            if seq_of.setdefault(a.meta["seq_nr"], new) != new:
                seq_of[a.meta["seq_nr"]] = None
    return seq_of


def _seq_base(nodes: list) -> int:
    return next((x.meta["seq_nr"] for x in nodes if "seq_nr" in x.meta), 0)


# per-layer counters in a shared node's metadata: autograd's sequence number and Dynamo's node
# names; anything else in a shared node must not change with the depth
_COUNTED = ("source_fn_stack", "fwd_source_fn_stack")


def _shared_meta(t3, t4, coords3, base3, base4, n) -> dict:
    m3, m4 = _symbolic_meta(t3, coords3), _symbolic_meta(t4, coords3)
    if list(m3) != list(m4):
        raise _Fallback(f"shared node {t3.name}: metadata keys differ with 3 and 4 layers")
    meta = {}
    for k, v in m3.items():
        if k == "seq_nr":
            rel = _fit([v - base3, m4[k] - base4], (3, 4), f"{t3.name} seq_nr")
            meta[k] = base3 + rel.at(n)
        elif k in _COUNTED:
            meta[k] = _fit([v, m4[k]], (3, 4), f"{t3.name} meta {k!r}").at(n)
        elif _same(v, m4[k]):
            meta[k] = _fresh(v)
        else:
            raise _Fallback(
                f"shared node {t3.name}: meta {k!r} differs with 3 and 4 layers "
                f"({str(v)[:80]} vs {str(m4[k])[:80]})"
            )
    return meta


def _output_meta(out, twin, elem_instances, layout, base3, base4, n) -> dict:
    out4 = twin[out]
    meta = {}
    for k, v in out.meta.items():
        if k == "desc":
            continue
        if k == "seq_nr":
            meta[k] = base3 + _fit([v - base3, out4.meta[k] - base4], (3, 4), "output seq_nr").at(n)
        elif k in _DROPPED_META:
            continue
        elif _same(v, out4.meta.get(k)):
            meta[k] = _fresh(v)
        else:
            raise _Fallback(f"the output node's meta {k!r} differs with 3 and 4 layers")
    descs = out.meta["desc"]
    slot_groups = _output_slot_groups(out, layout)
    fits = {}
    new_descs = []
    for j, L, b in elem_instances:
        if L is None:
            new_descs.append(descs[j])
            continue
        g, i = slot_groups["where"][j]
        if (g, i) not in fits:
            trip = [slot_groups["groups"][g][1][bb][i] for bb in range(3)]
            fits[(g, i)] = _fit([descs[jj] for jj in trip], (0, 1, 2), "output descriptor")
        new_descs.append(fits[(g, i)].at(L))
    meta["desc"] = new_descs
    return meta


def _output_slot_groups(out, layout) -> dict:
    """The output slots (gradients of a layer's parameters, new values of the buffers it
    writes in place) as runs, like the nodes."""
    cache = getattr(layout, "_out_groups", None)
    if cache is not None:
        return cache
    from torch._functorch._aot_autograd.descriptors import (
        BufferAOTInput,
        GradAOTOutput,
        InputMutationAOTOutput,
        ParamAOTInput,
    )

    ph_of = {}
    for p in layout.nodes:
        if p.op == "placeholder":
            d = p.meta.get("desc")
            if isinstance(d, (ParamAOTInput, BufferAOTInput)):
                ph_of[d.target] = p
    # the gradients come one per primal, in placeholder order; a None gradient (of a buffer)
    # has no descriptor, so its primal is found by position
    primals = [p for p in layout.nodes if p.op == "placeholder"]
    descs = list(out.meta["desc"])
    first_grad = next((j for j, d in enumerate(descs) if isinstance(d, GradAOTOutput)), None)
    labels = []
    for j, (v, d) in enumerate(zip(out.args[0], descs)):
        lab = None
        of = d.grad_of if isinstance(d, GradAOTOutput) else None
        if isinstance(d, InputMutationAOTOutput):
            of = d.mutated_input
        if first_grad is not None and j >= first_grad:
            k = j - first_grad
            primal = primals[k].meta.get("desc") if k < len(primals) else None
            if of is not None and repr(of) != repr(primal):
                raise _Fallback(f"output {j}: a gradient out of the primals' order")
            if d is None and v is None:
                of = primal
        if isinstance(of, (ParamAOTInput, BufferAOTInput)):
            p = ph_of.get(of.target)
            if p is None:
                raise _Fallback(f"output {j}: the gradient or new value of an unknown input")
            lab = layout.label[p]
        labels.append(lab)
    slots = list(range(len(labels)))
    runs = _runs(slots, lambda j: labels[j])
    groups, segments = _group_runs(runs, lambda j: f"output {j}")
    where = {}
    for g, (_, blocks, _) in enumerate(groups):
        for bb, run in enumerate(blocks):
            for i, j in enumerate(run):
                where[j] = (g, i)
    cache = {"labels": labels, "groups": groups, "segments": segments, "where": where}
    layout._out_groups = cache
    return cache


def _unrolled_outputs(out, layout, k3, n):
    """(template output node, [(slot, layer, block)] in the new order)."""
    sg = _output_slot_groups(out, layout)
    instances = []
    for kind, x in sg["segments"]:
        if kind == "shared":
            instances.append((x, None, None))
            continue
        direction, blocks, _ = sg["groups"][x]
        layers = range(n) if direction > 0 else range(n - 1, -1, -1)
        for L in layers:
            b = 0 if L == 0 else (2 if L == n - 1 else 1)
            instances.extend((j, L, b) for j in blocks[b])
    return out, instances


def _unrolled_codegen(codegen, layout, order, out, elem_instances):
    """The graph's calling convention with the flat lists of placeholders and outputs as long
    as the new graph's (``forward(self, primals, tangents)``)."""
    info = getattr(codegen, "pytree_info", None)
    if info is None:
        if type(codegen) is not fx.graph.CodeGen:
            raise _Fallback(f"unknown graph codegen {type(codegen).__name__}")
        return fx.graph.CodeGen()
    old_ph = [x for x in layout.nodes if x.op == "placeholder"]
    position = {x: j for j, x in enumerate(old_ph)}
    in_spec = _resized_spec(info.in_spec, [position[t] for t, _ in order if t in position])
    out_spec = info.out_spec
    if out_spec is not None:
        out_spec = _resized_spec(out_spec, [j for j, _, _ in elem_instances])
    return type(codegen)(type(info)(info.orig_args, in_spec, out_spec))


def _resized_spec(spec, templates: list):
    """``spec`` (leaves: the old flat placeholders / outputs) for the new leaves, given as the
    old leaf each one copies: every list of leaves gets the copies of its own leaves, which
    must come in the same order as the lists."""
    tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    lists = []

    def collect(x):
        if type(x) in (list, tuple) and x and all(isinstance(e, int) for e in x):
            lists.append(list(x))
        elif type(x) in (list, tuple):
            for e in x:
                collect(e)
        elif type(x) is dict:
            for e in x.values():
                collect(e)
        elif not isinstance(x, int):
            raise _Fallback(f"calling convention holds a {type(x).__name__}")
        else:
            raise _Fallback("calling convention has a leaf outside a list")

    collect(tree)
    list_of = {leaf: j for j, leaf_list in enumerate(lists) for leaf in leaf_list}
    if len(list_of) != spec.num_leaves:
        raise _Fallback("calling convention does not match the graph")
    seq = [list_of[t] for t in templates]
    if seq != sorted(seq):
        raise _Fallback("the unrolled leaves do not stay in their calling-convention lists")
    sizes = [seq.count(j) for j in range(len(lists))]
    it = iter(sizes)

    def rebuild(x):
        if type(x) in (list, tuple) and x and all(isinstance(e, int) for e in x):
            return type(x)([0] * next(it))
        if type(x) in (list, tuple):
            return type(x)(rebuild(e) for e in x)
        return {k: rebuild(v) for k, v in x.items()}

    return pytree.tree_structure(rebuild(tree))


def _name_skips(nodes, what: str, kept: set) -> dict:
    """node -> how many numbers of its name's base the trace skipped just before it. FX names
    nodes ``base``, ``base_1``, ... as they are created, and a trace drops nodes nothing reads
    (CLIP: add_1 in shared code, then add_3 in the first layer, add_2 dropped), so
    the new graph's names are counted the same way, skipping where its template's were
    (every copy of a layer's node skips what that layer's node skipped). Bases in ``kept``
    (no layer node has them) keep their names and are not counted."""
    skips: dict = {}
    seen: dict[str, int] = {}
    for x in nodes:
        base, k = _split_name(x.name)
        if base in seen and base not in kept:
            if k <= seen[base]:
                raise _Fallback(
                    f"{what} trace: node names are not in creation order " f"({x.name})"
                )
            skips[x] = k - seen[base] - 1
        seen[base] = k
    return skips


def _shared_bases(nodes: list, shared: Callable[[fx.Node], bool]) -> set:
    """Name bases (``arange`` of arange_3) of ops only shared nodes have."""
    in_layers = {_split_name(x.name)[0] for x in nodes if not shared(x)}
    return {
        b
        for x in nodes
        if x.op != "placeholder"
        for b in [_split_name(x.name)[0]]
        if b not in in_layers
    }


def _name_starts(nodes) -> dict:
    starts = {}
    for x in nodes:
        base, k = _split_name(x.name)
        starts.setdefault(base, k)
    return _DefaultStart(starts)


class _DefaultStart(dict):
    def __missing__(self, key):
        return 0


def _value_recipes(nodes: list) -> dict:
    """node -> (pytree spec, leaves) of its fake value: per tensor its properties and the
    (node, leaf) that first held its storage (None: its own). The values of a trace's views
    share their base's storage without being views (``_base`` is None), so the copies' values
    are made the same way: fake tensors set on a storage, new or the owner copy's."""
    from torch.multiprocessing.reductions import StorageWeakRef

    owner_of: dict = {}
    recipes = {}
    for x in nodes:
        if "val" not in x.meta:
            continue
        leaves, spec = pytree.tree_flatten(x.meta["val"])
        out = []
        for e, v in enumerate(leaves):
            if isinstance(v, torch.Tensor):
                if type(v) is not torch._subclasses.fake_tensor.FakeTensor or v._is_view():
                    raise _Fallback(f"the value of {x.name} is a {type(v).__name__} view")
                key = StorageWeakRef(v.untyped_storage())
                owner = owner_of.setdefault(key, (x, e))
                v = (
                    None if owner == (x, e) else owner,
                    v.untyped_storage().nbytes(),
                    v.dtype,
                    v.storage_offset(),
                    tuple(v.shape),
                    v.stride(),
                    v.device,
                    v.requires_grad,
                )
            elif not isinstance(v, (int, float, bool, type(None))):
                raise _Fallback(f"the value of {x.name} holds a {type(v).__name__}")
            out.append(v)
        recipes[x] = (spec, out)
    return recipes


def _value(template: fx.Node, fake_mode, recipes: dict, resolve: Callable):
    """meta["val"] of a copy of ``template``; ``resolve`` gives the copy of a storage's owner
    node."""
    from torch._subclasses.fake_tensor import FakeTensor

    spec, leaves = recipes[template]
    out = []
    for v in leaves:
        if isinstance(v, tuple):
            owner, nbytes, dtype, offset, shape, stride, device, requires_grad = v
            if owner is None:
                storage = torch.UntypedStorage(nbytes, device="meta")
            else:
                base = pytree.tree_leaves(resolve(owner[0]).meta["val"])[owner[1]]
                storage = base.untyped_storage()
                if storage.nbytes() != nbytes:
                    raise _Fallback(f"{template.name}: storage of {nbytes} bytes expected")
            elem = torch.empty(0, dtype=dtype, device="meta").set_(storage, offset, shape, stride)
            v = FakeTensor(fake_mode, elem, device)
            if requires_grad:
                v.requires_grad_(True)
        out.append(v)
    return pytree.tree_unflatten(out, spec)


# ---------------------------------------------------------------------------------------------
# comparing two traced steps


def _canonical_val(v, owner_of: dict, name: str, slot: list) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    if isinstance(v, torch.Tensor):
        key = StorageWeakRef(v.untyped_storage())
        owner = owner_of.setdefault(key, f"{name}[{slot[0]}]")
        slot[0] += 1
        return (
            "T",
            type(v).__name__,
            tuple(v.shape),
            v.stride(),
            str(v.dtype),
            str(v.device),
            v.storage_offset(),
            v.untyped_storage().nbytes(),
            v.requires_grad,
            v._is_view(),
            owner,
        )
    if isinstance(v, (list, tuple)):
        return tuple(_canonical_val(x, owner_of, name, slot) for x in v)
    return repr(v)


class _Ref:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "%" + self.name


def describe_step(step) -> dict:
    """A canonical, comparable form of a TracedStep: nodes with their arguments by name and
    metadata (module ids by order of appearance, ``seq_nr`` relative to the graph's first,
    fake values by shape, strides, dtype and the node first holding their storage) and every
    other field. Two traces of the same model compare equal."""
    nodes = []
    module_keys: dict[str, int] = {}
    owner_of: dict = {}
    base = _seq_base(list(step.gm.graph.nodes))
    for x in step.gm.graph.nodes:
        meta = []
        for k, v in x.meta.items():
            if k in _DROPPED_META:
                continue
            if k == "val":
                v = _canonical_val(v, owner_of, x.name, [0])
            elif k == "seq_nr":
                v = v - base
            elif k in _STACKS and isinstance(v, dict):
                v = [(module_keys.setdefault(kk, len(module_keys)), vv) for kk, vv in v.items()]
                v = repr(v)
            else:
                v = repr(v)
            meta.append((k, v))
        if x.op == "get_attr":  # a constant by its value: copies read equal tensors
            c = getattr(step.gm, x.target, None)
            meta.append(
                (
                    "constant",
                    (
                        repr((c.dtype, tuple(c.shape), c.tolist()))
                        if (isinstance(c, torch.Tensor) and c.device.type != "meta")
                        else repr(c)
                    ),
                )
            )
        nodes.append(
            (
                x.name,
                x.op,
                repr(x.target),
                repr(fx.node.map_arg((x.args, x.kwargs), lambda u: _Ref(u.name))),
                tuple(meta),
            )
        )
    graph = step.gm.graph
    info = getattr(graph._codegen, "pytree_info", None)
    fields = {}
    for f in dataclasses.fields(step):
        if f.name in ("gm", "fake_mode", "trace_seconds", "joint_with_descriptors"):
            continue
        v = getattr(step, f.name)
        if f.name == "outputs":
            v = [
                (o.node.name if o.node is not None else None, o.role, o.output_index, o.grad_of)
                for o in v
            ]
        fields[f.name] = (
            repr(v)
            if f.name in ("input_spec", "output_spec", "forward_signature", "device", "input_metas")
            else v
        )
    return {
        "nodes": nodes,
        "fields": fields,
        "code": step.gm.code,
        "codegen": (
            type(graph._codegen).__name__,
            None if info is None else (info.orig_args, str(info.in_spec), str(info.out_spec)),
        ),
        "attrs": sorted(k for k in step.gm.__dict__ if not k.startswith("_"))
        + sorted(k for k, _ in step.gm.named_children()),
    }


def first_difference(a, b) -> str | None:
    """The first difference between two TracedSteps (describe_step), or None if equal."""
    da, db = describe_step(a), describe_step(b)
    na, nb = da["nodes"], db["nodes"]
    for j, (x, y) in enumerate(zip(na, nb)):
        if x != y:
            for label, u, v in zip(("name", "op", "target", "args", "meta"), x, y):
                if u != v:
                    if label == "meta":
                        du, dv = dict(u), dict(v)
                        for k in list(du) + [k for k in dv if k not in du]:
                            if du.get(k) != dv.get(k):
                                return (
                                    f"node {j} ({x[0]}) meta {k!r}: "
                                    f"{str(du.get(k))[:300]} vs {str(dv.get(k))[:300]}"
                                )
                    return f"node {j} ({x[0]}) {label}: {str(u)[:300]} vs {str(v)[:300]}"
    if len(na) != len(nb):
        return f"{len(na)} vs {len(nb)} nodes"
    for k in da["fields"]:
        if da["fields"][k] != db["fields"].get(k):
            return f"TracedStep.{k}: {str(da['fields'][k])[:300]} vs {str(db['fields'][k])[:300]}"
    for k in ("codegen", "attrs", "code"):
        if da[k] != db[k]:
            return f"gm {k} differs"
    return None
