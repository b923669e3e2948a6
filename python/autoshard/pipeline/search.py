"""Choosing a pipeline on paper: candidate meshes (pp x dp x tp), schedules, microbatch
counts, recomputation and FSDP modes, each priced by the C++ core's discrete-event model of
the schedule (``_core.price_pipeline``) on per-stage costs, the cheapest that fits the
memory limit chosen. docs/pipeline.md, "Choosing a pipeline".

Stage costs come from a ``StageProfile``: one sequence's cost of a layer, of what comes
before the layer stack (the embedding) and after it (norm, head, loss) on a tp sub-mesh.
Two sources: ``planner_profile`` traces the model with 2 and with 3 layers and plans both
with autoshard (the difference is one layer: compute and communication of the layouts the
planner picked), ``flops_profile`` counts a model's matmul and attention FLOPs and prices
them with the hardware's roofline (no tracing; what ``plan_pipeline`` uses by default).
A microbatch of ``k`` sequences per rank costs ``k`` times one sequence."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Iterable

from autoshard import _core

GiB = 2**30
# bytes per parameter (mixed precision, Adam): bf16 parameters and fp32 gradients as the
# stage computes with them; fp32 master parameters and two fp32 moments, sharded over dp
HELD_BYTES, SHARDED_BYTES = 2 + 4, 4 + 8
SCHEDULE_NAMES = ("GPipe", "1F1B", "Interleaved1F1B")


@dataclass
class StageProfile:
    """One sequence's costs on the tp sub-mesh (times in us, activations in bytes,
    parameters in elements per GPU)."""

    tp: int
    layer_f_us: float
    layer_b_us: float
    layer_saved: int
    layer_params: int
    first_f_us: float
    first_b_us: float
    last_f_us: float
    last_b_us: float
    extra_saved: int  # embedding, head and loss activations (on the last stage)
    extra_params: int  # embedding and head parameters, half on each end stage
    layer_input_bytes: int  # one sequence's hidden state: what a stage sends on
    plan_s: float = 0.0
    notes: list = field(default_factory=list)

    def scaled(self, sequences: int) -> "StageProfile":
        """The same costs for a microbatch of ``sequences`` sequences per rank."""
        k = sequences
        return replace(
            self,
            layer_f_us=k * self.layer_f_us,
            layer_b_us=k * self.layer_b_us,
            layer_saved=k * self.layer_saved,
            first_f_us=k * self.first_f_us,
            first_b_us=k * self.first_b_us,
            last_f_us=k * self.last_f_us,
            last_b_us=k * self.last_b_us,
            extra_saved=k * self.extra_saved,
            layer_input_bytes=k * self.layer_input_bytes,
        )


@dataclass(frozen=True)
class Candidate:
    pp: int
    dp: int
    tp: int
    schedule: str
    virtual: int
    microbatches: int
    recompute: str  # "none" or "full"
    fsdp: str  # "step": gathered once, held for the step; "microbatch": gathered per use
    sequences: int = 1  # sequences per microbatch per data-parallel rank

    def label(self) -> str:
        sched = self.schedule if self.pp > 1 else "none (accumulation)"
        return sched + (f" v={self.virtual}" if self.virtual > 1 else "")


@dataclass(frozen=True)
class PricedCandidate:
    """A candidate with its price: ``estimate`` is ``_core.price_pipeline``'s dict (plus
    ``peak_gib`` and the ``stages`` priced)."""

    candidate: Candidate
    step_us: float
    bubble: float
    peak_bytes: int
    fits: bool
    estimate: dict = field(compare=False, repr=False)


TABLE_HEAD = (
    "| | mesh | schedule | microbatches | recompute | FSDP gathers | step (ms) | bubble "
    "| peak GiB | fits |\n|---|---|---|---:|---|---|---:|---:|---:|---|"
)


def _ms(us: float) -> str:
    """Whole milliseconds for a real model's step, three decimals below 100 ms."""
    return f"{us / 1e3:,.0f}" if us >= 1e5 else f"{us / 1e3:.3f}"


def table_row(label: str, p: PricedCandidate) -> str:
    c = p.candidate
    return (
        f"| {label} | pp={c.pp} dp={c.dp} tp={c.tp} | {c.label()} | {c.microbatches} | "
        f"{c.recompute} | {c.fsdp} | {_ms(p.step_us)} | {100 * p.bubble:.1f} % | "
        f"{p.peak_bytes / GiB:.1f} | {'yes' if p.fits else 'no'} |"
    )


@dataclass
class PipelineSearch:
    """Every candidate priced, and the choice: the fastest step among those that fit."""

    priced: list[PricedCandidate]
    memory_limit_bytes: float
    chosen: PricedCandidate | None

    def fitting(self) -> list[PricedCandidate]:
        """The candidates that fit, fastest first."""
        return sorted((p for p in self.priced if p.fits), key=lambda p: p.step_us)

    def table(self, top: int | None = 10) -> str:
        """A markdown table of the ``top`` fastest candidates that fit (all with None),
        then the ones that do not fit, least memory first, when none fits."""
        rows = self.fitting()
        if not rows:
            rows = sorted(self.priced, key=lambda p: p.peak_bytes)
        rows = rows if top is None else rows[:top]
        lines = [TABLE_HEAD]
        for p in rows:
            lines.append(table_row("chosen" if p is self.chosen else "", p))
        return "\n".join(lines)

    def report(self, top: int | None = 10) -> str:
        """Why this pipeline: the choice, how many were priced and fit, and the table."""
        n_fit = len(self.fitting())
        limit = (
            "no memory limit"
            if math.isinf(self.memory_limit_bytes)
            else f"memory limit {self.memory_limit_bytes / GiB:.3g} GiB"
        )
        head = f"{len(self.priced)} candidates priced, {n_fit} fit ({limit}); "
        if self.chosen is None:
            head += "none fits: the least memory first"
        else:
            c = self.chosen.candidate
            head += (
                f"chosen pp={c.pp} dp={c.dp} tp={c.tp} {c.label()}, {c.microbatches} "
                f"microbatches: step {self.chosen.step_us / 1e3:,.3f} ms, bubble "
                f"{100 * self.chosen.bubble:.1f} %"
            )
        return head + "\n" + self.table(top)

    def __str__(self) -> str:
        return self.report()


def stage_costs(c: Candidate, prof: StageProfile, n_layers: int) -> list[tuple[int, dict, int]]:
    """(parameters per GPU, cost dict without resident bytes, first layer) of every stage
    of ``c``, the layers cut by ``_core.balanced_split`` on the profile's costs."""
    prof = prof.scaled(c.sequences) if c.sequences != 1 else prof
    n_stages = c.pp * c.virtual
    full = c.recompute == "full"
    f, b = prof.layer_f_us, prof.layer_b_us + (prof.layer_f_us if full else 0.0)
    saved = prof.layer_input_bytes if full else prof.layer_saved
    starts = _core.balanced_split(
        [f + b] * n_layers,
        n_stages,
        prof.first_f_us + prof.first_b_us,
        prof.last_f_us + prof.last_b_us,
    )
    bounds = list(starts) + [n_layers]
    out = []
    for s in range(n_stages):
        k = bounds[s + 1] - bounds[s]
        first, last = s == 0, s == n_stages - 1
        params = k * prof.layer_params + (prof.extra_params // 2 if first or last else 0)
        cost = {
            "forward_us": k * f
            + (prof.first_f_us if first else 0)
            + (prof.last_f_us if last else 0),
            "backward_us": k * b
            + (prof.first_b_us if first else 0)
            + (prof.last_b_us if last else 0),
            "saved_bytes": k * saved + (prof.extra_saved if last else 0),
            "send_bytes": prof.layer_input_bytes,
        }
        out.append((params, cost, bounds[s]))
    return out


def _dp_us(c: Candidate, params: int, hardware: str) -> float:
    """A reduce-scatter of the gradients and an all-gather of the parameters over dp."""
    if c.dp == 1:
        return 0.0
    mesh = [c.pp, c.dp, c.tp]
    rs = _core.collective_time_us("reduce_scatter", 4.0 * params, hardware, mesh, 1)
    return rs + _core.collective_time_us("all_gather", 2.0 * params, hardware, mesh, 1)


def price(c: Candidate, prof: StageProfile, n_layers: int, hardware: str = "H100") -> dict:
    """``_core.price_pipeline``'s estimate of candidate ``c`` (plus ``peak_gib``, the
    ``stages`` priced and the ``split_points`` they were cut at)."""
    stages = []
    reduction = [0.0] * c.pp
    costs = stage_costs(c, prof, n_layers)
    for s, (params, cost, _) in enumerate(costs):
        if c.fsdp == "step":  # held for the step, reduced once at its end
            cost["resident_bytes"] = HELD_BYTES * params + SHARDED_BYTES * params // c.dp
            reduction[s % c.pp] += _dp_us(c, params, hardware)
        else:  # gathered for each microbatch's forward and backward, reduced each backward
            cost["resident_bytes"] = (HELD_BYTES + SHARDED_BYTES) * params // c.dp
            cost["resident_bytes"] += HELD_BYTES * prof.layer_params  # one layer gathered
            per_mb = _dp_us(c, params, hardware)
            cost["forward_us"] += per_mb / 3
            cost["backward_us"] += 2 * per_mb / 3
        stages.append(cost)
    link = _core.mesh_dim_links(hardware, [c.pp, c.dp, c.tp])[0]
    est = _core.price_pipeline(
        c.schedule, c.pp, c.microbatches, stages, link["bandwidth"], link["latency_us"], reduction
    )
    est["peak_gib"] = max(est["rank_peak_bytes"]) / GiB
    est["stages"] = stages
    est["split_points"] = [first for _, _, first in costs[1:]]
    return est


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def schedules_for(pp: int, m: int, n_layers: int, virtuals: Iterable[int]) -> list[tuple]:
    """(schedule, stages per rank) that torch runs for ``pp`` ranks and ``m`` microbatches:
    1F1B needs ``m >= pp``; interleaved also ``m % pp == 0`` and a layer per stage. One
    rank (pp=1) is plain gradient accumulation, priced as GPipe."""
    if pp == 1:
        return [("GPipe", 1)]
    if m < pp:
        return []
    out = [("1F1B", 1)]
    if m % pp == 0:
        out += [("Interleaved1F1B", v) for v in virtuals if v > 1 and n_layers >= pp * v]
    return out


def candidates(
    n_gpus: int,
    batch: int,
    n_layers: int,
    tps: Iterable[int] = (1, 2, 4, 8),
    pps: Iterable[int] = (1, 2, 4, 8, 16, 32),
    virtuals: Iterable[int] = (2, 4),
    microbatch_sequences: Iterable[int] = (1,),
    recomputes: Iterable[str] = ("none", "full"),
    fsdps: Iterable[str] = ("step", "microbatch"),
) -> list[Candidate]:
    """Every candidate on ``n_gpus`` for a global ``batch`` of sequences: meshes pp x dp x
    tp filling the GPUs with the batch splitting over dp, microbatches of each of
    ``microbatch_sequences`` sequences per dp rank, the schedules torch runs for them."""
    out = []
    for tp in tps:
        for pp in pps:
            if n_gpus % (pp * tp):
                continue
            dp = n_gpus // (pp * tp)
            if batch % dp:
                continue
            for k in microbatch_sequences:
                if (batch // dp) % k:
                    continue
                m = batch // dp // k
                for sched, v in schedules_for(pp, m, n_layers, virtuals):
                    for rc in recomputes:
                        for fsdp in fsdps:
                            out.append(Candidate(pp, dp, tp, sched, v, m, rc, fsdp, k))
    return out


def search(
    cands: list[Candidate],
    profiles: dict[int, StageProfile],
    n_layers: int,
    memory_limit_bytes: float = math.inf,
    hardware: str = "H100",
) -> PipelineSearch:
    """Price every candidate (``profiles``: a StageProfile per tp degree) and choose the
    fastest step that fits ``memory_limit_bytes`` per GPU (ties: the earlier candidate)."""
    if not cands:
        raise ValueError(
            "pipeline search: no candidate to price (no mesh, schedule and microbatch count "
            "fits the world size, batch and layers; see plan_pipeline's docstring)"
        )
    missing = sorted({c.tp for c in cands} - set(profiles))
    if missing:
        raise ValueError(f"pipeline search: no StageProfile for tp={missing}")
    priced = []
    for c in cands:
        est = price(c, profiles[c.tp], n_layers, hardware)
        peak = max(est["rank_peak_bytes"])
        priced.append(
            PricedCandidate(
                c, est["step_us"], est["bubble_fraction"], peak, peak <= memory_limit_bytes, est
            )
        )
    fitting = [p for p in priced if p.fits]
    chosen = min(fitting, key=lambda p: p.step_us) if fitting else None
    return PipelineSearch(priced, memory_limit_bytes, chosen)


def hardware_with_nodes(hardware: str, gpus_per_node: int | None) -> str:
    """``hardware`` (a built-in name) with ``gpus_per_node`` GPUs per node, as the JSON
    profile the C++ core takes (the pipeline's links cross nodes where the mesh does)."""
    if gpus_per_node is None:
        return hardware
    if gpus_per_node < 1:
        raise ValueError(f"pipeline: gpus_per_node={gpus_per_node}; at least 1")
    return json.dumps({"base": hardware, "gpus_per_node": int(gpus_per_node)})


# ---- stage profiles -------------------------------------------------------------------


def _matrix_elements(module) -> int:
    return sum(p.numel() for p in module.parameters() if p.ndim == 2)


def flops_profile(model, seq: int, hardware: str = "H100", dtype: str = "float32") -> StageProfile:
    """A tp=1 profile of an ``autoshard.models.Llama``-shaped model (``layers``,
    ``tok_embeddings``, ``output``, ``cfg.dim``) from its FLOPs, no tracing: a layer's
    forward is 2 FLOPs per matrix element and token plus causal attention (2 * seq * dim
    per token), its backward twice that, each priced with ``_core.compute_time_us``; a
    layer saves about ``10 * dim + 3 * ffn`` activations per token (the inputs of its
    matmuls, attention and activation function: an estimate, not the planner's count)."""
    width = _core.dtype_bytes(dtype)
    dim = model.cfg.dim
    layer = model.layers[0]
    mm = _matrix_elements(layer)
    ffn = getattr(model.cfg, "ffn_dim", None) or 4 * dim
    layer_fwd = seq * (2.0 * mm + 2.0 * seq * dim)
    head_fwd = 2.0 * seq * _matrix_elements(model.output)
    weights = mm * width

    def us(flops, bytes_moved):
        return _core.compute_time_us(hardware, flops, bytes_moved, dtype)

    vocab = model.output.weight.shape[0]
    return StageProfile(
        tp=1,
        layer_f_us=us(layer_fwd, weights),
        layer_b_us=us(2 * layer_fwd, 2 * weights),
        layer_saved=seq * (10 * dim + 3 * ffn) * width,
        layer_params=sum(p.numel() for p in layer.parameters()),
        first_f_us=us(0.0, seq * dim * width),
        first_b_us=us(0.0, seq * dim * width),
        last_f_us=us(head_fwd, (vocab * dim + 2 * seq * vocab) * width),
        last_b_us=us(2 * head_fwd, (2 * vocab * dim + seq * vocab) * width),
        extra_saved=seq * (dim + vocab) * width,
        extra_params=sum(p.numel() for p in model.parameters())
        - len(model.layers) * sum(p.numel() for p in layer.parameters()),
        layer_input_bytes=seq * dim * width,
        notes=["flops"],
    )


def _trace_graph(cfg, tp: int, mp_policy) -> dict:
    """One sequence's training step of ``Llama(cfg)`` traced on a fake tp mesh."""
    import torch

    from autoshard.api.autoparallel import AutoParallel
    from autoshard.models import Llama
    from autoshard.trace.fake_pg import fake_world

    with torch.device("meta"):
        model = Llama(cfg)

    def input_fn():
        return tuple(torch.empty(1, cfg.max_seq_len, dtype=torch.long) for _ in range(2))

    with fake_world((tp,), ("tp",)) as mesh:
        with AutoParallel(model, input_fn, mesh, mp_policy=mp_policy) as autop:
            return json.loads(autop.graph_json())


def _plan(cfg, tp: int, time_limit: float, hardware: str) -> tuple[dict, dict]:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    graph = _trace_graph(cfg, tp, mp)
    # the layouts' own costs: memory is counted by the pipeline's pricing (recomputation is
    # a candidate's choice there), so the stage plan neither recomputes nor fits a limit;
    # identical layers share one layout, so that a layer costs the same in both traces
    options = {
        "mesh": {"shape": [tp], "dim_names": ["tp"]},
        "hardware": hardware,
        "time_limit_s": time_limit,
        "recompute": "none",
        "memory_limit_bytes": 10**18,
        "repeated_layers": "tie",
    }
    plan = json.loads(_core.plan_graph(json.dumps(graph), json.dumps(options)))
    return graph, plan


def _costs_by_part(graph: dict, plan: dict) -> dict:
    """(part, phase) -> us: part 'layer' (all layers), 'first' (embedding), 'last' (the rest)."""
    out: dict = {}
    for n in graph["nodes"]:
        cost = plan["nodes"].get(n["name"], {})
        us = cost.get("compute_us", 0.0) + cost.get("comm_us", 0.0)
        # module paths may sit under a wrapper (the mixed-precision trace's "inner.")
        path = (n.get("module") or "").split(".")
        part = "layer" if "layers" in path else "first" if "tok_embeddings" in path else "last"
        key = (part, n.get("phase") or "forward")
        out[key] = out.get(key, 0.0) + us
    return out


def planner_profile(
    config_with_layers, tp: int, seq: int, time_limit: float, hardware: str = "H100"
) -> StageProfile:
    """One sequence's stage costs from autoshard's plans (bf16 compute, fp32 gradients):
    ``config_with_layers(n)`` is the model's ``LlamaConfig`` with ``n`` layers; the model
    is traced with 2 and 3 layers on a tp mesh and planned there, the difference is one
    layer; the embedding's nodes go to the first stage, the rest outside the layers to the
    last."""
    t0 = time.perf_counter()
    figures = {}
    for layers in (2, 3):
        graph, plan = _plan(config_with_layers(layers), tp, time_limit, hardware)
        figures[layers] = (_costs_by_part(graph, plan), plan["summary"]["memory"])
    c2, m2 = figures[2]
    c3, m3 = figures[3]
    dim = config_with_layers(1).dim
    saved = m3["saved_activations"] - m2["saved_activations"]
    params = (m3["parameters"] - m2["parameters"]) // 4  # fp32 parameters, bf16 compute
    return StageProfile(
        tp=tp,
        layer_f_us=c3.get(("layer", "forward"), 0) - c2.get(("layer", "forward"), 0),
        layer_b_us=c3.get(("layer", "backward"), 0) - c2.get(("layer", "backward"), 0),
        layer_saved=saved,
        layer_params=params,
        first_f_us=c2.get(("first", "forward"), 0),
        first_b_us=c2.get(("first", "backward"), 0),
        last_f_us=c2.get(("last", "forward"), 0),
        last_b_us=c2.get(("last", "backward"), 0),
        # what the 2-layer plan holds beyond two layers (never below 0: the two plans may
        # lay out the head differently)
        extra_saved=max(0, m2["saved_activations"] - 2 * saved),
        extra_params=max(0, m2["parameters"] // 4 - 2 * params),
        layer_input_bytes=seq * dim * 2,
        plan_s=time.perf_counter() - t0,
        notes=["planner"],
    )
