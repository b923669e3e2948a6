"""Hand-written baseline plans to measure autoshard's plans against.

``megatron_pins(graph, ...)`` writes the Megatron-LM / torchtitan recipe for a Llama-style
model on a (dp, tp) mesh as pins (input and node constraints) on the traced graph:

* tensor parallelism on ``tp``: ``wq wk wv w1 w3`` (and the vocabulary projection
  ``output``) column-parallel, ``wo w2`` row-parallel; attention heads sharded on ``tp``;
* sequence parallelism on ``tp``: the residual stream between the blocks (every block's
  residual add, i.e. every norm input but the first) is sharded on the sequence dim; each
  norm's output is the all-gathered input of the column-parallel linears;
* FSDP on ``dp``: every weight is additionally sharded on ``dp`` at rest, on the dim that
  ``tp`` does not shard (so the dp all-gather leaves exactly the tp shard);
* the batch (tokens and labels) sharded on ``dp``.

Two layers of the recipe need ops the rules do not have, and use the nearest supported
form: the vocabulary-parallel embedding lookup (masked partial sums) becomes an embedding
table split on its embedding dim, and the vocabulary-parallel cross-entropy (Megatron's
fused loss) is left to the solver, which must gather the vocabulary dim of the logits
before the log-softmax.

Everything not pinned (rotary embedding, the backward pass, where the all-gathers and
reduce-scatters run, the loss) is left to the solver, so the baseline is the best plan
that follows the recipe under the cost model - never a worse one than the recipe itself.

``compare_with_megatron(graph_json, ...)`` plans the same graph twice under the same cost
model - with those pins (Megatron) and without them (autoshard) - with the same mesh,
hardware, inputs, parameter-memory budget and memory limit, and returns both summaries.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

# Which linear layers of a Llama-style model are column- and row-parallel, by the last
# component of their module path (models.py: Attention.wq/wk/wv/wo, FeedForward.w1/w2/w3).
COLUMN_PARALLEL = ("wq", "wk", "wv", "w1", "w3")
ROW_PARALLEL = ("wo", "w2")
VOCAB_PARALLEL = ("output",)  # the logits projection: column-parallel on the vocabulary
EMBEDDING = ("tok_embeddings",)

_BLOCK = re.compile(r"^layers\.\d+$")  # the residual adds live in the block module itself
_NORM_SUFFIXES = ("attention_norm", "ffn_norm")
_FINAL_NORM = "norm"


class BaselineError(ValueError):
    """The graph does not look like the model the baseline is written for."""


@dataclass
class PinSet:
    """Pins in the planner's options format, and why each one is there (for reports)."""

    input_constraints: dict[str, list[str]] = field(default_factory=dict)
    node_constraints: dict[str, list[str]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # node name -> what it pins

    def pin(self, name: str, layout: list[str], why: str) -> None:
        if name in self.node_constraints and self.node_constraints[name] != layout:
            raise BaselineError(
                f"node '{name}' would be pinned twice, to "
                f"{self.node_constraints[name]} and {layout} ({why})"
            )
        self.node_constraints[name] = layout
        self.reasons[name] = why

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for why in self.reasons.values():
            kind = why.split(":")[0]
            out[kind] = out.get(kind, 0) + 1
        return out


def _layout(dp: int, tp: int, dp_p: str, tp_p: str) -> list[str]:
    """One placement per mesh dim: ``dp_p`` on the dp dim, ``tp_p`` on the tp dim."""
    layout = ["R", "R"]
    layout[dp] = dp_p
    layout[tp] = tp_p
    return layout


def _mesh_dims(
    mesh_dim_names: Sequence[str] | None, mesh_ndim: int, dp_name: str, tp_name: str
) -> tuple[int, int]:
    if mesh_ndim != 2:
        raise BaselineError(
            f"the Megatron baseline needs a 2-d (dp, tp) mesh, got {mesh_ndim} "
            "dims; for a pure tp or dp mesh use a (1, n) or (n, 1) mesh"
        )
    names = list(mesh_dim_names) if mesh_dim_names else ["dp", "tp"]
    if dp_name not in names or tp_name not in names:
        raise BaselineError(
            f"mesh dims are named {names}; pass dp_name/tp_name naming the "
            f"data- and tensor-parallel dims (looked for {dp_name!r}, "
            f"{tp_name!r})"
        )
    dp, tp = names.index(dp_name), names.index(tp_name)
    if dp == tp:
        raise BaselineError("dp_name and tp_name name the same mesh dim")
    return dp, tp


def _last(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def megatron_pins(
    graph: dict | str,
    mesh_ndim: int = 2,
    mesh_dim_names: Sequence[str] | None = ("dp", "tp"),
    dp_name: str = "dp",
    tp_name: str = "tp",
    sp_dim: int = 1,
) -> PinSet:
    """The Megatron (TP + SP + FSDP + DP) plan of a Llama-style graph as pins.

    ``graph`` is the tensor graph (docs/formats.md section 1) as JSON text or dict, traced
    from ``autoshard.models.Llama`` or a model with the same module names. ``sp_dim`` is the
    dim of the [batch, seq, dim] residual stream that tp shards between the blocks: 1, the
    sequence (Megatron's recipe), or 0, the batch. Both split the tokens tp ways; Megatron's
    [seq, batch] activations make its sequence split a contiguous token range, which in
    this [batch, seq] layout is the batch split (when each dp rank's batch is a multiple of
    tp), the one the row-parallel outputs [batch*seq, dim] reduce-scatter into without an
    extra all-to-all. Raises BaselineError when a layer the recipe needs cannot be found."""
    g = json.loads(graph) if isinstance(graph, str) else graph
    dp, tp = _mesh_dims(mesh_dim_names, mesh_ndim, dp_name, tp_name)
    if sp_dim not in (0, 1):
        raise BaselineError(f"sp_dim must be 1 (sequence) or 0 (batch), got {sp_dim!r}")
    pins = PinSet()
    S = lambda d: f"S({d})"  # noqa: E731
    nodes = g.get("nodes")
    if not isinstance(nodes, list):
        raise BaselineError("graph: expected a 'nodes' list (docs/formats.md section 1)")

    # Parameters at rest: tp shards what the layer's parallel style says, dp (FSDP) the
    # other dim of the weight, so gathering dp leaves exactly the tp shard.
    n_weights = 0
    for n in nodes:
        if n.get("op") != "placeholder":
            continue
        role = n.get("role")
        if role == "input":
            shape = n["outputs"][0]["shape"]
            if not shape:
                raise BaselineError(
                    f"input '{n['name']}' is a scalar; the baseline shards "
                    "the batch dim of every input"
                )
            pins.input_constraints[n["name"]] = _layout(dp, tp, S(0), "R")
            continue
        if role != "parameter":
            continue
        fqn = n.get("fqn", "")
        parts = fqn.split(".")
        owner = parts[-2] if len(parts) >= 2 else ""
        rank = len(n["outputs"][0]["shape"])
        if parts[-1] == "bias":
            raise BaselineError(f"parameter '{fqn}': the Llama recipe has no biases")
        if owner in COLUMN_PARALLEL or owner in VOCAB_PARALLEL:
            # [out, in]: tp on the output features (the vocabulary for `output`)
            layout = _layout(dp, tp, S(1), S(0))
            kind = "weight: column-parallel"
        elif owner in EMBEDDING:
            # [vocab, dim]: Megatron splits the vocabulary on tp, but a vocab-sharded lookup
            # needs masked partial sums that the rules do not offer (rules/embedding.cpp), so
            # the table is split on the embedding dim instead, the other tensor-parallel
            # embedding; pinning the vocab split would force gathering the whole table.
            layout = _layout(dp, tp, S(0), S(1))
            kind = "weight: embedding-dim-parallel embedding"
        elif owner in ROW_PARALLEL:
            layout = _layout(dp, tp, S(0), S(1))  # [out, in]: tp on the input columns
            kind = "weight: row-parallel"
        elif rank == 1 and (owner in _NORM_SUFFIXES or owner == _FINAL_NORM):
            layout = _layout(dp, tp, S(0), "R")  # norm weights: replicated on tp
            kind = "weight: norm"
        else:
            raise BaselineError(
                f"parameter '{fqn}' (shape {n['outputs'][0]['shape']}) is not "
                "part of the Llama recipe (wq/wk/wv/wo/w1/w2/w3, norms, "
                "tok_embeddings, output)"
            )
        if rank != 2 and not kind.startswith("weight: norm"):
            raise BaselineError(f"parameter '{fqn}' has rank {rank}; expected a 2-d weight")
        pins.pin(n["name"], layout, kind)
        n_weights += 1
    if n_weights == 0:
        raise BaselineError("graph has no parameters to pin")
    if not pins.input_constraints:
        raise BaselineError("graph has no input placeholders (tokens, labels)")

    # Forward activations, recognised by op and module path.
    last_in_module: dict[str, str] = {}  # norm module -> its last forward node (the output)
    found = {"column": 0, "row": 0, "residual": 0, "norm": 0}
    for n in nodes:
        if n.get("phase") != "forward" or n.get("op") == "placeholder":
            continue
        op, mod, name = n["op"], n.get("module") or "", n["name"]
        last = _last(mod) if mod else ""
        if op == "aten.mm.default":
            if last in COLUMN_PARALLEL or last in VOCAB_PARALLEL:
                # [b*s, out]: the output features sharded on tp (heads / ffn / vocab)
                pins.pin(name, _layout(dp, tp, S(0), S(1)), f"column: {mod} output")
                found["column"] += 1
            elif last in ROW_PARALLEL:
                # [b*s, out]: partial sums on tp, reduce-scattered onto the sequence dim by
                # whoever consumes them (the residual add below)
                pins.pin(name, _layout(dp, tp, S(0), "P(sum)"), f"row: {mod} output")
                found["row"] += 1
        elif "scaled_dot_product" in op and not op.endswith("backward.default"):
            # [b, heads, s, head_dim]: heads on tp
            pins.pin(name, _layout(dp, tp, S(0), S(1)), f"attention: {mod} heads")
        # The embedding output (the first norm's input) is left free: with the table split
        # on the embedding dim, the lookup yields the embedding dim sharded and the solver
        # moves it onto the sequence dim where the first block wants it (pinning the
        # lookup's own output sequence-sharded would need the whole table on every GPU).
        elif op == "aten.add.Tensor" and _BLOCK.match(mod) and len(n["outputs"][0]["shape"]) == 3:
            # residual stream [b, s, dim]: sequence-parallel between the blocks
            pins.pin(name, _layout(dp, tp, S(0), S(sp_dim)), f"residual: {mod} add")
            found["residual"] += 1
        if last in _NORM_SUFFIXES or mod == _FINAL_NORM:
            last_in_module[mod] = name
    by_name = {n["name"]: n for n in nodes}
    for mod, name in last_in_module.items():
        shape = by_name[name]["outputs"][0]["shape"]
        if len(shape) != 3:
            raise BaselineError(
                f"norm '{mod}': its last forward node '{name}' has shape "
                f"{shape}, expected [batch, seq, dim]"
            )
        # the all-gathered norm output: the input every column-parallel linear reads
        pins.pin(name, _layout(dp, tp, S(0), "R"), f"norm: {mod} output (gathered)")
        found["norm"] += 1
    missing = [k for k, v in found.items() if v == 0]
    if missing:
        raise BaselineError(
            f"graph lacks the Llama layers the recipe pins ({', '.join(missing)}); "
            "trace autoshard.models.Llama or a model with its module names "
            "(layers.N.attention.wq, ..., layers.N.attention_norm, ...)"
        )
    return pins


# ---- evaluation ---------------------------------------------------------------------------


@dataclass
class PlanFigures:
    """The summary figures of one plan (microseconds, bytes per GPU)."""

    total_us: float
    compute_us: float
    comm_us: float  # every collective in full
    exposed_comm_us: float  # the part not hidden behind compute: total = compute + this
    parameter_bytes_per_gpu: int
    lower_bound_us: float
    plan_seconds: float
    plan: dict = field(repr=False, default_factory=dict)

    @classmethod
    def of(cls, plan: dict, seconds: float) -> "PlanFigures":
        s = plan["summary"]
        return cls(
            float(s["total_us"]),
            float(s["compute_us"]),
            float(s["comm_us"]),
            float(s.get("exposed_comm_us", s["comm_us"])),
            int(s["parameter_bytes_per_gpu"]),
            float(s.get("lower_bound_us", 0.0)),
            seconds,
            plan,
        )

    def line(self, label: str) -> str:
        return (
            f"{label:<18} total {self.total_us / 1e3:10.3f} ms = compute "
            f"{self.compute_us / 1e3:9.3f} ms + exposed comm {self.exposed_comm_us / 1e3:9.3f} ms "
            f"(of {self.comm_us / 1e3:.3f}); "
            f"parameters {self.parameter_bytes_per_gpu / 2**20:9.2f} MiB/GPU; "
            f"lower bound {self.lower_bound_us / 1e3:9.3f} ms; planned in "
            f"{self.plan_seconds:.1f} s"
        )


@dataclass
class Comparison:
    """autoshard's plan against the Megatron recipe; ``megatron`` is the best of the
    recipe's variants (``variants``: label -> figures, e.g. the sequence- and the batch-split
    residual stream)."""

    megatron: PlanFigures
    autoshard: PlanFigures
    pins: PinSet  # the pins of the best variant
    options: dict  # the options both runs share (without the Megatron pins)
    variants: dict[str, PlanFigures] = field(default_factory=dict)

    def report(self) -> str:
        m, a = self.megatron, self.autoshard
        gain = (m.total_us - a.total_us) / m.total_us * 100 if m.total_us else 0.0
        lines = [v.line(f"megatron[{k}]") for k, v in self.variants.items()]
        lines += [
            a.line("autoshard"),
            f"autoshard vs best megatron: {gain:+.2f}% faster step "
            f"({len(self.pins.node_constraints)} node pins: {self.pins.counts()})",
        ]
        return "\n".join(lines)


SP_VARIANTS = {"sp=seq": 1, "sp=batch": 0}


def _batch_splits_over(graph: dict, ways: int) -> bool:
    """Whether every input's batch dim splits evenly ``ways`` ways (dp x tp)."""
    shapes = [n["outputs"][0]["shape"] for n in graph["nodes"] if n.get("role") == "input"]
    return bool(shapes) and all(s and s[0] % ways == 0 for s in shapes)


def parameter_bytes(graph: dict) -> int:
    """Total bytes of every parameter of the graph (global shapes)."""
    from autoshard import _core

    total = 0
    for n in graph["nodes"]:
        if n.get("role") == "parameter":
            o = n["outputs"][0]
            total += math.prod(o["shape"]) * _core.dtype_bytes(o["dtype"])
    return total


def compare_with_megatron(
    graph_json: str,
    mesh_shape: Sequence[int],
    mesh_dim_names: Sequence[str] = ("dp", "tp"),
    hardware: str = "H100",
    memory_limit_bytes: int | None = None,
    time_limit_s: float = 20.0,
    dp_name: str = "dp",
    tp_name: str = "tp",
    variants: dict[str, int] | None = None,
    recompute: str | None = None,
) -> Comparison:
    """Plans ``graph_json`` with the Megatron pins (each variant: label -> sp_dim, default
    both SP_VARIANTS) and without them, under the same cost model, mesh, hardware, input
    layouts (batch on dp), memory limit and parameter-memory budget. The budget is the
    Megatron plans' own parameter bytes per GPU (as a fraction of all parameter bytes; the
    variants pin the weights alike), so the Megatron plans lie inside autoshard's search
    space and the comparison is of equal memory. ``recompute``: what the backward may
    recompute to fit the memory limit (PlannerOptions.recompute; None: the planner's
    default, "auto"), the same for all."""
    from autoshard import _core

    graph = json.loads(graph_json)
    if variants is None:
        variants = dict(SP_VARIANTS)
        if not _batch_splits_over(graph, math.prod(mesh_shape)):
            del variants["sp=batch"]  # fewer sequences than GPUs: only the sequence split
    variants = dict(variants)
    if not variants:
        raise BaselineError("compare_with_megatron: no Megatron variant to plan")
    pin_sets = {
        label: megatron_pins(graph, len(mesh_shape), mesh_dim_names, dp_name, tp_name, sp_dim)
        for label, sp_dim in variants.items()
    }
    first = next(iter(pin_sets.values()))
    common: dict[str, Any] = {
        "mesh": {"shape": list(mesh_shape), "dim_names": list(mesh_dim_names)},
        "hardware": hardware,
        "input_constraints": first.input_constraints,
        "time_limit_s": time_limit_s,
    }
    if memory_limit_bytes is not None:
        common["memory_limit_bytes"] = int(memory_limit_bytes)
    if recompute is not None:
        common["recompute"] = recompute

    def plan(options: dict) -> PlanFigures:
        t0 = time.perf_counter()
        text = _core.plan_graph(graph_json, json.dumps(options))
        return PlanFigures.of(json.loads(text), time.perf_counter() - t0)

    # The Megatron runs need no budget: their pins fix every weight's layout.
    figures = {
        label: plan({**common, "node_constraints": pins.node_constraints, "parameter_memory": None})
        for label, pins in pin_sets.items()
    }
    best = min(figures, key=lambda k: figures[k].total_us)
    megatron = figures[best]
    total = parameter_bytes(graph)
    # A hair above the Megatron fraction so rounding never makes its own plan infeasible.
    fraction = min(1.0, megatron.parameter_bytes_per_gpu / total * (1 + 1e-9) + 1e-12)
    common["parameter_memory"] = {"low": 0.0, "high": fraction}
    auto = plan(common)
    return Comparison(megatron, auto, pin_sets[best], common, figures)


# ---- tracing ------------------------------------------------------------------------------


@dataclass
class TracedGraph:
    graph_json: str
    trace_seconds: float  # model build on meta + trace + graph export
    aten_nodes: int  # call_function nodes of the joint graph (getitem included)
    parameters: int  # parameter elements


def trace_llama(
    cfg,
    mesh_shape: Sequence[int],
    mesh_dim_names: Sequence[str] = ("dp", "tp"),
    batch: int | None = None,
    batch_per_dp: int = 8,
    mp_policy=None,
) -> TracedGraph:
    """Builds ``autoshard.models.Llama(cfg)`` on the meta device and traces one
    training step on a fake process group of ``mesh_shape`` (no GPU, no collectives).
    ``batch`` is the global batch (default ``batch_per_dp`` sequences per rank of the "dp"
    mesh dim, else of the first mesh dim) of ``cfg.max_seq_len`` tokens; ``mp_policy``: a
    MixedPrecisionPolicy (e.g. bf16 compute, fp32 reductions), as AutoParallel takes it."""
    import torch

    from autoshard.api.autoparallel import AutoParallel
    from autoshard.trace.fake_pg import fake_world
    from autoshard.models import Llama

    names = list(mesh_dim_names)
    if len(names) != len(mesh_shape):
        raise ValueError(f"{len(names)} mesh dim names for a {len(mesh_shape)}-d mesh")
    if batch is None:
        batch = batch_per_dp * int(mesh_shape[names.index("dp") if "dp" in names else 0])
    seq = cfg.max_seq_len
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = Llama(cfg)
    n_params = sum(p.numel() for p in model.parameters())

    def input_fn():
        return (
            torch.empty(batch, seq, dtype=torch.long),
            torch.empty(batch, seq, dtype=torch.long),
        )

    with fake_world(tuple(mesh_shape), tuple(names)) as mesh:
        with AutoParallel(model, input_fn, mesh, mp_policy=mp_policy) as autop:
            text = autop.graph_json()
            n_nodes = sum(1 for n in autop.gm.graph.nodes if n.op == "call_function")
    return TracedGraph(text, time.perf_counter() - t0, n_nodes, n_params)
