"""Before ranks plan together: are they all here, and planning the same thing?

Every rank traces its own model, and rank 0's plan is broadcast to all (api.py). A rank
that never arrives would leave the others blocked in that broadcast, and a rank with a
different model (other sizes, another layer count) or other constraints would run rank 0's
plan on tensors it does not fit: a size error deep in a collective, or a missing graph
input. So first every rank waits for the others under a timeout, then they compare digests
of what they plan: the traced graph, the mesh, the constraints and the options. Any
difference stops every rank with the same message naming what differs and on which ranks.
Nothing here runs on a fake process group (planning a mesh larger than the machine) or a
single rank.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from typing import Any

import torch.distributed as dist

from .fake_pg import real_multi_rank_group

log = logging.getLogger("autoshard")

DEFAULT_TIMEOUT_S = 300.0

_WHAT = {
    "graph": "the traced graph differs",
    "mesh": "the mesh differs",
    "constraints": "the constraints differ",
    "options": "the options differ",
    "plan": "the plan differs",
}
_HINTS = {
    "graph": "the traced models or example inputs differ (model class, sizes, number of "
    "layers, input shapes or dtypes): every rank must build the same model",
    "mesh": "the DeviceMesh differs (shape, dim names, device type or rank layout)",
    "constraints": "the input / output / node constraints or the parameter memory "
    "constraint differ",
    "options": "the AutoParallel options differ (hardware, time_limit_s, gap_tolerance, "
    "memory_limit_bytes, strict, runtime, compile, capture, mp_policy)",
    "plan": "the plans passed to apply_placement differ",
}


class RankMismatchError(RuntimeError):
    """Ranks are planning different models, meshes, constraints or options."""


class RankTimeoutError(RuntimeError):
    """Some rank did not reach planning within the timeout."""


def digest(value: Any) -> str:
    """A deterministic hash of plain data (strings hashed as they are)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def needs_agreement() -> bool:
    return real_multi_rank_group()


def check_ranks_agree(
    parts: dict[str, Any], summaries: dict[str, str], mesh, timeout_s: float
) -> None:
    """Wait up to ``timeout_s`` for every rank, then compare the digests of ``parts``
    (name -> plain data); ``summaries`` (name -> short text) are shown in a mismatch."""
    if not needs_agreement():
        return
    world = dist.get_world_size()
    if mesh.size() != world:
        # only the mesh's ranks plan; a group of just them would itself need every rank
        log.info(
            "autoshard: the mesh spans %d of %d ranks: skipping the cross-rank check",
            mesh.size(),
            world,
        )
        return
    wait_for_all_ranks(timeout_s)
    mine = {name: (digest(value), summaries.get(name, "")) for name, value in parts.items()}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    problems = []
    for name in parts:
        by_value: dict[tuple, list[int]] = {}
        for rank, theirs in enumerate(gathered):
            by_value.setdefault(theirs[name], []).append(rank)
        if len(by_value) > 1:
            groups = "; ".join(
                f"{_ranks(ranks)}: {summary + ' ' if summary else ''}#{h}"
                for (h, summary), ranks in by_value.items()
            )
            problems.append(
                f"{_WHAT.get(name, name + ' differs')} ({groups}): " f"{_HINTS.get(name, '')}"
            )
    if problems:
        raise RankMismatchError(
            "autoshard: the ranks are not planning the same step: " + " | ".join(problems)
        )


_generation = 0  # how many checks this process has made: the key space of each one


def wait_for_all_ranks(timeout_s: float) -> None:
    """A barrier that gives up after ``timeout_s`` and names the ranks that did not come:
    gloo's monitored_barrier does; other backends (NCCL) wait on a plain barrier. Every rank
    also leaves a mark in the process group's store first, so that every rank, not only
    rank 0, can name the missing ones when the barrier fails."""
    global _generation
    _generation += 1
    store = _arrival_store()
    key = f"autoshard/arrived/{_generation}/"
    if store is not None:
        store.set(key + str(dist.get_rank()), "1")
    timeout = datetime.timedelta(seconds=float(timeout_s))
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
            return
        work = dist.barrier(async_op=True)
        if work.wait(timeout=timeout) is not False:
            return
        cause = "the barrier timed out"
    except RuntimeError as e:
        cause = str(e).strip().splitlines()[0]
    missing = _absent_ranks(store, key)
    who = (
        f"rank(s) {', '.join(map(str, missing))} did not reach planning"
        if missing
        else "the ranks did not all meet before planning (if this rank is the late one, "
        "the others stopped waiting)"
    )
    raise RankTimeoutError(
        f"autoshard: {who} within {timeout_s:g} s (rank_timeout_s): a rank is stalled, has "
        "crashed, or runs other code; raise rank_timeout_s if some ranks are just slower to "
        f"get here (torch: {cause})"
    )


def _arrival_store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no store to look at: the error names no ranks
        return None


def _absent_ranks(store, key: str) -> list[int]:
    if store is None:
        return []
    try:
        return [r for r in range(dist.get_world_size()) if not store.check([key + str(r)])]
    except Exception:
        return []


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
