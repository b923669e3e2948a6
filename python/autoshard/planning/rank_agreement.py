"""Before ranks plan together: are they all here, and planning the same thing?

Every rank traces its own model, and rank 0's plan is broadcast to all (api/autoparallel.py). A rank
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

from autoshard.trace.fake_pg import real_multi_rank_group

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
    """Wait up to ``timeout_s`` for every rank to reach planning, and name the ranks that
    did not come. The wait goes through the process group's key-value store, not a
    collective: a barrier on NCCL is a kernel on the GPU that never completes when a rank
    is missing (nothing names it, the job hangs until NCCL's own timeout), and the store
    works the same for every backend."""
    global _generation
    _generation += 1
    store = _arrival_store()
    if store is None:  # no store to look at (a custom backend): a plain barrier
        _barrier_naming_no_one(timeout_s)
        return
    missing, late = arrive_and_agree(
        store,
        dist.get_rank(),
        dist.get_world_size(),
        f"autoshard/arrived/{_generation}/",
        timeout_s,
    )
    if missing:
        raise RankTimeoutError(_timeout_message(missing, late, dist.get_rank(), timeout_s))


def arrive_and_agree(
    store, rank: int, world: int, prefix: str, timeout_s: float
) -> tuple[list[int], bool]:
    """Leave this rank's mark under ``prefix`` in ``store``, wait up to ``timeout_s`` for
    every rank's, and settle with the others on one verdict. Returns (the ranks missing
    when the verdict was made, whether this rank is one of them); ([], False): go on.

    The verdict is one key written once (compare_set: the first rank to decide wins, the
    others read its value), so every rank acts on the same answer: a rank arriving just
    after the others gave up learns that it was counted missing and stops too, instead of
    entering the next collective alone and hanging there."""
    store.set(f"{prefix}{rank}", "1")
    keys = [f"{prefix}{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=float(timeout_s)))
        mine = "go"
    except RuntimeError:  # DistStoreError: the timeout
        mine = "missing:" + ",".join(map(str, _absent_ranks(store, keys)))
    verdict = store.compare_set(f"{prefix}verdict", "", mine)
    verdict = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
    if verdict == "go" or verdict == "missing:":  # missing: nobody, by the time of the check
        return [], False
    missing = [int(r) for r in verdict.split(":", 1)[1].split(",")]
    return missing, rank in missing


def _timeout_message(missing: list[int], late: bool, rank: int, timeout_s: float) -> str:
    who = ", ".join(map(str, missing))
    if late:
        return (
            f"autoshard: this rank ({rank}) reached planning after the others had stopped "
            f"waiting for it (rank_timeout_s={timeout_s:g} s; missing then: rank(s) {who}): "
            "this rank was slower than the others by more than the timeout (a slow start, "
            "a long data load, other code before planning); raise rank_timeout_s if that "
            "is expected"
        )
    return (
        f"autoshard: rank(s) {who} did not reach planning within {timeout_s:g} s "
        "(rank_timeout_s): a rank is stalled, has crashed, or runs other code; raise "
        "rank_timeout_s if some ranks are just slower to get here"
    )


def _barrier_naming_no_one(timeout_s: float) -> None:
    timeout = datetime.timedelta(seconds=float(timeout_s))
    try:
        work = dist.barrier(async_op=True)
        if work.wait(timeout=timeout) is not False:
            return
        cause = "the barrier timed out"
    except RuntimeError as e:
        cause = str(e).strip().splitlines()[0]
    raise RankTimeoutError(
        f"autoshard: the ranks did not all meet before planning within {timeout_s:g} s "
        "(rank_timeout_s): a rank is stalled, has crashed, or runs other code; raise "
        f"rank_timeout_s if some ranks are just slower to get here (torch: {cause})"
    )


def _arrival_store():
    """The default process group's store, where it has one with the operations the
    arrival check uses (set, wait, check, compare_set)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:
        return None
    needed = ("set", "wait", "check", "compare_set")
    return store if all(hasattr(store, op) for op in needed) else None


def _absent_ranks(store, keys: list[str]) -> list[int]:
    return [r for r, key in enumerate(keys) if not store.check([key])]


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
