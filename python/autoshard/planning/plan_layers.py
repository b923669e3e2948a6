"""A plan JSON read per layer: what `autoshard view`, `explain` and `diff` show.

The plan (docs/formats.md section 3) holds per node its layouts and its compute and
communication cost, in graph order. Which layer a node belongs to, its op and its shapes
come from the traced graph: either the plan's optional ``node_info`` (written by
`autoshard demo --plan-out`) or a graph JSON given next to it (``--graph``).
"""

from __future__ import annotations

import gzip
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from autoshard.blocks import block_prefix
from autoshard.planning.plan import Plan

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
}
# forward ops whose output is the activation worth showing per layer
MAIN_OPS = (
    "aten.mm.default",
    "aten.bmm.default",
    "aten.addmm.default",
    "aten.embedding.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_efficient_attention.default",
)
NO_LAYER = "(graph)"


def load_json(path: str) -> dict:
    """A plan or graph JSON file, gzip-compressed or not."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return doc


def load_plan(path: str, graph_path: str | None = None) -> Plan:
    plan = Plan.from_json(load_json(path), where=path)
    if graph_path:
        plan.node_info = node_info(load_json(graph_path))
    return plan


def node_info(graph: dict) -> dict:
    """Per graph node what the plan lacks: op, role, module / parameter name, phase, first
    output's shape and dtype (only the fields the graph has)."""
    info = {}
    for n in graph.get("nodes", []):
        e = {k: n[k] for k in ("op", "role", "fqn", "module", "phase") if k in n}
        out = (n.get("outputs") or [None])[0]
        if isinstance(out, dict):
            e["shape"], e["dtype"] = out.get("shape"), out.get("dtype")
        info[n["name"]] = e
    return info


def layer_of(path: str | None) -> str:
    """`layers.3.attention.wq` -> `layers.3`; `tok_embeddings` -> `tok_embeddings`: the
    module path up to its first block index (a repeated block is one layer)."""
    if not path:
        return NO_LAYER
    return block_prefix(path) or path.split(".")[0]


def fmt_layout(layout) -> str:
    return "(" + ",".join(layout) + ")" if layout else "-"


def local_bytes(shape, dtype: str | None, layout, mesh_shape) -> int:
    """Bytes one GPU holds of a tensor in ``layout`` (largest chunk of uneven splits)."""
    dims = list(shape or [])
    for size, p in zip(mesh_shape, layout or []):
        if p.startswith("S(") and p.endswith(")"):
            d = int(p[2:-1])
            if 0 <= d < len(dims):
                dims[d] = math.ceil(dims[d] / size)
    return math.prod(dims) * DTYPE_BYTES.get(dtype or "float32", 4)


@dataclass
class Layer:
    name: str
    compute_us: float = 0.0
    comm_us: float = 0.0
    param_bytes: int = 0
    nodes: int = 0
    weights: list = field(default_factory=list)  # (fqn, layout)
    activations: list = field(default_factory=list)  # (node, op, inputs, output)


def node_layer(name: str, plan: Plan) -> str:
    e = plan.info(name)
    return layer_of(e.get("fqn") or e.get("module"))


def layers(plan: Plan) -> list[Layer]:
    """Per layer (in the order the graph first meets them): compute and communication time,
    parameter bytes per GPU, each weight's layout and the main forward activations' layouts."""
    out: dict[str, Layer] = OrderedDict()
    for name, e in plan.nodes.items():
        meta = plan.info(name)
        key = node_layer(name, plan)
        layer = out.setdefault(key, Layer(key))
        layer.nodes += 1
        layer.compute_us += e.compute_us
        layer.comm_us += e.comm_us
        if meta.get("role") == "parameter":
            layer.weights.append((meta.get("fqn", name), e.output))
            layer.param_bytes += local_bytes(
                meta.get("shape"), meta.get("dtype"), e.output, plan.mesh_shape
            )
        elif meta.get("op") in MAIN_OPS and meta.get("phase", "forward") == "forward":
            layer.activations.append((name, meta["op"].split(".")[1], e.inputs, e.output))
    # first appearance is model order (parameters come first, in registration order);
    # nodes of no module (inputs, loss, optimizer-free glue) go last
    return sorted(out.values(), key=lambda l: l.name == NO_LAYER)


def timeline(plan: Plan) -> list[tuple[str, str, float, float, str]]:
    """The step as the cost model sums it, node by node in graph order: each node's input
    redistributions (communication) then its op (compute), one after the other. Returns
    (node, kind, start_us, duration_us, layer) for every non-zero segment."""
    t = 0.0
    segs = []
    for name, e in plan.nodes.items():
        layer = node_layer(name, plan)
        for kind, d in (("comm", e.comm_us), ("compute", e.compute_us)):
            if d > 0:
                segs.append((name, kind, t, d, layer))
                t += d
    return segs


def backward_start_us(plan: Plan) -> float | None:
    """Where the first backward node starts on the timeline (None without phases)."""
    t = 0.0
    for name, e in plan.nodes.items():
        if plan.info(name).get("phase") == "backward":
            return t
        t += e.comm_us + e.compute_us
    return None
