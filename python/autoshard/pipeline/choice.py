"""What ``plan_pipeline`` chooses when the user leaves it out: the mesh (pp x dp for a world
size), the schedule, the stages per rank and the microbatch count, each candidate priced by
``search.py`` on a model's stage costs and the cheapest that fits the memory limit taken.
Only what the runtime runs is a candidate: a (pp, dp) mesh whose stage mesh is the one dp
dim (pp >= 2), the dp gradients reduced in every microbatch's backward (``fsdp=
"microbatch"``), no recomputation. Deterministic, so every rank chooses alike."""

from __future__ import annotations

import json
import math

from autoshard.pipeline.search import (
    SCHEDULE_NAMES,
    PipelineSearch,
    StageProfile,
    candidates,
    flops_profile,
    hardware_with_nodes,
    search,
)

AUTO = (None, "auto")
MAX_VIRTUAL = 8


def _check_fixed(schedule, n_microbatches, virtual_stages) -> None:
    if schedule not in AUTO and schedule not in SCHEDULE_NAMES:
        raise ValueError(
            f"pipeline: schedule {schedule!r}; one of {list(SCHEDULE_NAMES)} or None/'auto' "
            "(the planner chooses)"
        )
    for name, value in (("n_microbatches", n_microbatches), ("virtual_stages", virtual_stages)):
        if value not in AUTO and (not isinstance(value, int) or value < 1):
            raise ValueError(f"pipeline: {name}={value!r}; a positive int or None (chosen)")
    if schedule in ("GPipe", "1F1B") and virtual_stages not in AUTO and virtual_stages != 1:
        raise ValueError(
            f"pipeline: schedule {schedule!r} runs one stage per rank; virtual_stages="
            f"{virtual_stages} needs Interleaved1F1B"
        )


def hardware_name(hardware, device_type: str) -> str:
    """The cost model's profile for pricing: the planner's ``hardware`` keyword when it
    names one (a name or a dict of fields), else "CPU" for a CPU mesh, "H100" otherwise."""
    if isinstance(hardware, dict):
        return json.dumps(hardware)
    if isinstance(hardware, str) and hardware != "measure":
        return hardware
    return "CPU" if device_type == "cpu" else "H100"


def choose_pipeline(
    model,
    sample_inputs: tuple,
    *,
    world_size: int,
    gpus_per_node: int | None = None,
    pp: int | None = None,
    schedule: str | None = None,
    n_microbatches: int | None = None,
    virtual_stages: int | None = None,
    hardware: str = "H100",
    memory_limit_bytes: float | None = None,
    profile: StageProfile | None = None,
) -> PipelineSearch:
    """Price every pipeline of ``model`` (an ``autoshard.models.Llama``-shaped model, meta
    tensors will do) over ``world_size`` ranks that the runtime can run and choose the
    fastest that fits ``memory_limit_bytes`` per rank (default: no limit). ``pp`` and
    ``schedule`` / ``n_microbatches`` / ``virtual_stages`` fix those choices (None: all
    are candidates); ``sample_inputs`` is ``(tokens, labels)`` of one step's whole batch.
    ``profile``: the stage costs per sequence (default: ``flops_profile``; pass
    ``search.planner_profile``'s for the planner's layouts). Returns the priced table and
    the choice (``.chosen.candidate``: pp, dp, schedule, virtual, microbatches);
    ``print(result)`` explains it. Raises ValueError naming what cannot be met."""
    _check_fixed(schedule, n_microbatches, virtual_stages)
    tokens = sample_inputs[0]
    batch, seq = int(tokens.shape[0]), int(tokens.shape[-1])
    n_layers = len(model.layers)
    if world_size < 2:
        raise ValueError(
            f"pipeline: world_size={world_size}; a pipeline needs at least 2 ranks (pass "
            "world_size=, or plan inside an initialised process group)"
        )
    if pp is not None and (pp < 2 or world_size % pp):
        raise ValueError(
            f"pipeline: pp={pp} does not divide the {world_size} ranks into pipeline stages "
            "(pp >= 2 and a divisor of the world size)"
        )
    pps = [pp] if pp else [p for p in range(2, world_size + 1) if world_size % p == 0]
    if min(pps) > n_layers:
        raise ValueError(
            f"pipeline: {n_layers} layers cannot fill {min(pps)} pipeline stages; use fewer "
            "pipeline ranks (pp) or a model with more layers"
        )
    virtuals = [virtual_stages] if virtual_stages not in AUTO else range(2, MAX_VIRTUAL + 1)
    hw = hardware_with_nodes(hardware, gpus_per_node)
    cands = candidates(
        world_size,
        batch,
        n_layers,
        tps=(1,),
        pps=[p for p in pps if p <= n_layers],
        virtuals=virtuals,
        microbatch_sequences=range(1, batch + 1),
        recomputes=("none",),
        fsdps=("microbatch",),
    )
    cands = [
        c
        for c in cands
        if c.pp > 1
        and (schedule in AUTO or c.schedule == schedule)
        and (n_microbatches in AUTO or c.microbatches == n_microbatches)
        and (virtual_stages in AUTO or c.virtual == virtual_stages)
    ]
    if not cands:
        raise ValueError(
            f"pipeline: no pipeline of {world_size} ranks runs a batch of {batch} sequences "
            f"over {n_layers} layers with pp={pp or 'any'}, schedule={schedule or 'any'}, "
            f"n_microbatches={n_microbatches or 'any'}, virtual_stages="
            f"{virtual_stages or 'any'}: the batch must split into dp parts of whole "
            "microbatches, 1F1B needs at least pp microbatches, Interleaved1F1B a multiple "
            "of pp and a layer per stage"
        )
    prof = profile or flops_profile(model, seq, hardware, _dtype_name(model))
    limit = math.inf if memory_limit_bytes is None else float(memory_limit_bytes)
    found = search(cands, {1: prof}, n_layers, limit, hw)
    if found.chosen is None:
        raise ValueError(
            "pipeline: no candidate fits the memory limit of "
            f"{limit / 2**30:.3g} GiB per rank; the least memory:\n{found.table()}"
        )
    return found


def _dtype_name(model) -> str:
    p = next(iter(model.parameters()), None)
    return str(p.dtype).removeprefix("torch.") if p is not None else "float32"
