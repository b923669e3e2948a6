"""Plans are kernel-agnostic for scaled dot-product attention.

``F.scaled_dot_product_attention`` becomes a different ATen kernel on each host: on CPU
``_scaled_dot_product_flash_attention_for_cpu``; on a GPU flash, memory-efficient or cuDNN
attention, chosen by dtype, mask, head size and GPU at trace time (and a CPU-only torch
traces fake CUDA tensors through the math fallback, so a CPU host cannot trace the kernel a
GPU will run). A plan made on one host (the demo, a saved plan) names the kernel nodes of its
own trace, which a trace on the other host does not have.

Every attention kernel has the same sharding rows (cpp/src/rules/attention.cpp): per mesh
dim, shard the batch dim (0) or the head dim (1) of every activation-shaped tensor (rank >= 3)
together, or replicate; tensors of rank < 3 (RNG state, cumulative lengths) stay replicated,
and a bias is replicated on a dim it broadcasts over. So one kernel node's layouts carry over
to another kernel's node: the row (the dim each mesh dim shards) is read off the plan node's
first tensor input (q, or grad_out in a backward), and the layouts of the graph's node are
those of the same row. ``match_attention_kernels`` pairs the plan's attention nodes missing
from the graph with the graph's attention nodes missing from the plan, forward with forward
and backward with backward, in graph order.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch
import torch.fx as fx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelSpec:
    """Where a kernel takes its bias / mask (positional indices and keyword names), and
    which output is the bias gradient (-1: none)."""

    backward: bool
    bias_args: tuple[int, ...] = ()
    bias_kwargs: tuple[str, ...] = ()
    grad_bias_output: int = -1


# the kernels of cpp/src/rules/attention.cpp, with the same bias positions
KERNELS: dict[str, KernelSpec] = {
    "_scaled_dot_product_flash_attention_for_cpu": KernelSpec(False, (), ("attn_mask",)),
    "_scaled_dot_product_flash_attention_for_cpu_backward": KernelSpec(True, (), ("attn_mask",)),
    "_scaled_dot_product_flash_attention": KernelSpec(False),
    "_scaled_dot_product_flash_attention_backward": KernelSpec(True),
    "_scaled_dot_product_efficient_attention": KernelSpec(False, (3,), ("attn_bias",)),
    "_scaled_dot_product_efficient_attention_backward": KernelSpec(
        True, (4,), ("attn_bias",), grad_bias_output=3
    ),
    "_scaled_dot_product_cudnn_attention": KernelSpec(False, (3,), ("attn_bias",)),
    "_scaled_dot_product_cudnn_attention_backward": KernelSpec(True, (8,), ("attn_bias",)),
}

_ROW_PLACEMENTS = {"R", "S(0)", "S(1)"}


def kernel_of(node: fx.Node) -> str | None:
    """The attention kernel ``node`` calls (its ATen name, no overload), or None."""
    if node.op != "call_function":
        return None
    packet = getattr(node.target, "overloadpacket", None)
    name = getattr(packet, "__name__", None)
    return name if name in KERNELS else None


_NAME = re.compile(r"^(?P<op>.+?)(?:_default)?(?:_(?P<k>\d+))?$")


def kernel_of_name(node_name: str) -> str | None:
    """The kernel a plan node's name says it calls: a trace names a call after its op
    (``graph.call_function`` adds the overload, ``_default``), with ``_<k>`` appended from
    the second call on. (No kernel's own name ends in a number or in "_default".)"""
    m = _NAME.match(node_name)
    return m["op"] if m and m["op"] in KERNELS else None


def _order_key(node_name: str) -> int:
    """A plan node's place among the calls of its op (FX numbers them in graph order)."""
    m = _NAME.match(node_name)
    return int(m["k"]) if m and m["k"] else 0


def _input_roles(node: fx.Node, spec: KernelSpec) -> list[bool]:
    """For each tensor reference of ``node`` (args then kwargs, depth first: the plan's
    ``inputs`` order), whether it is the bias / mask."""
    roles: list[bool] = []
    for i, a in enumerate(node.args):
        fx.node.map_arg(a, lambda _n, bias=i in spec.bias_args: roles.append(bias))
    for k, v in node.kwargs.items():
        fx.node.map_arg(v, lambda _n, bias=k in spec.bias_kwargs: roles.append(bias))
    return roles


def _refs(node: fx.Node) -> list[fx.Node]:
    refs: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), refs.append)
    return refs


def _val(node: fx.Node):
    return node.meta.get("val")


def _row_of(entry: dict) -> list[str] | None:
    """The plan entry's row: per mesh dim "S(0)" (batch), "S(1)" (heads) or "R", read off
    its first tensor input; None when that is not one of the rows (the entry is left
    alone)."""
    inputs = entry.get("inputs") or []
    first = inputs[0] if inputs else None
    if not isinstance(first, list) or not all(p in _ROW_PLACEMENTS for p in first):
        return None
    return list(first)


def _bias_placement(q: torch.Tensor, bias: torch.Tensor, placement: str) -> str:
    """The rule's bias_placement: the bias follows the row on a dim where it has q's full
    size, and is replicated where it broadcasts (a size-1 or missing dim)."""
    if placement == "R":
        return "R"
    dim = int(placement[2])
    bdim = dim - (q.dim() - bias.dim())
    if bdim < 0 or bias.shape[bdim] != q.shape[dim] or bias.shape[bdim] == 1:
        return "R"
    return f"S({bdim})"


def entry_for_row(node: fx.Node, row: list[str]) -> dict | None:
    """``node``'s input and output layouts in ``row`` (one placement per mesh dim), or None
    where the kernel has no such row (a bias gradient owed on a dim the bias broadcasts
    over)."""
    spec = KERNELS[kernel_of(node)]
    refs = _refs(node)
    roles = _input_roles(node, spec)
    q_at = 1 if spec.backward else 0  # a backward's first tensor is grad_out, then q
    q = _val(refs[q_at])
    vals = _val(node)
    vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
    gb = spec.grad_bias_output
    owes_bias_grad = 0 <= gb < len(vals) and isinstance(vals[gb], torch.Tensor)
    inputs, bias_layout = [], None
    for ref, is_bias in zip(refs, roles):
        v = _val(ref)
        if not isinstance(v, torch.Tensor):
            inputs.append(None)
        elif is_bias:
            bias_layout = [_bias_placement(q, v, p) for p in row]
            if owes_bias_grad and any(b == "R" and p != "R" for b, p in zip(bias_layout, row)):
                return None
            inputs.append(bias_layout)
        else:
            inputs.append(list(row) if v.dim() >= 3 else ["R"] * len(row))
    outputs = [
        (list(row) if v.dim() >= 3 else ["R"] * len(row)) if isinstance(v, torch.Tensor) else None
        for v in vals
    ]
    if owes_bias_grad and bias_layout is not None:
        outputs[gb] = list(bias_layout)  # the bias gradient has the bias's shape
    return {"inputs": inputs, "outputs": outputs}


def match_attention_kernels(plan: dict, gm: fx.GraphModule) -> dict:
    """``plan`` with entries for the attention nodes of ``gm`` it does not name, carried
    over by role from the attention nodes it names that ``gm`` lacks (another kernel, traced
    on another host). Returns ``plan`` itself when there is nothing to carry over, else a
    copy; when the two sides' counts differ, nothing is carried over (with a warning)."""
    nodes = plan.get("nodes") or {}
    graph_names = {n.name for n in gm.graph.nodes}
    missing = [n for n in gm.graph.nodes if kernel_of(n) and n.name not in nodes]
    if not missing:
        return plan
    stale = [name for name in nodes if kernel_of_name(name) and name not in graph_names]
    new_nodes = dict(nodes)
    for backward in (False, True):
        want = [n for n in missing if KERNELS[kernel_of(n)].backward == backward]
        have = sorted(
            (name for name in stale if KERNELS[kernel_of_name(name)].backward == backward),
            key=lambda name: (_order_key(name), name),
        )
        if not want:
            continue
        if len(want) != len(have):
            log.warning(
                "autoshard: the plan names %d attention %s kernel calls this graph lacks, "
                "and the graph has %d it does not name (%s): their layouts are left to "
                "DTensor",
                len(have),
                "backward" if backward else "forward",
                len(want),
                ", ".join(n.name for n in want[:3]),
            )
            continue
        for node, source in zip(want, have):
            row = _row_of(nodes[source])
            entry = entry_for_row(node, row) if row is not None else None
            if entry is None:
                log.warning(
                    "autoshard: plan node %s has no attention row that %s (%s) has: its "
                    "layouts are left to DTensor",
                    source,
                    node.name,
                    kernel_of(node),
                )
                continue
            new_nodes[node.name] = {**nodes[source], **entry}
            log.info(
                "autoshard: attention node %s (%s) takes the layouts of plan node %s (%s)",
                node.name,
                kernel_of(node),
                source,
                kernel_of_name(source),
            )
    return {**plan, "nodes": new_nodes}
