"""The arrival check before planning (rank_agreement.arrive_and_agree) goes through the
process group's store, not a collective, so it names missing ranks on every backend (a
barrier on NCCL would hang instead). Ranks are threads sharing one store here; the
torchrun test (test_rank_arrival_dist.py) runs it on real gloo processes."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from autoshard.planning.rank_agreement import RankTimeoutError, _timeout_message, arrive_and_agree


def _arrive(store, ranks, world, timeout_s, delay_s=None):
    """Each rank of ``ranks`` arrives in a thread (after ``delay_s[rank]`` seconds);
    returns rank -> (result, seconds it waited)."""
    out = {}

    def one(rank):
        time.sleep((delay_s or {}).get(rank, 0.0))
        t0 = time.monotonic()
        out[rank] = (arrive_and_agree(store, rank, world, "t/", timeout_s), time.monotonic() - t0)

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_ranks_that_all_arrive_go_on():
    out = _arrive(dist.HashStore(), [0, 1, 2], 3, timeout_s=10.0)
    assert {r: res for r, (res, _) in out.items()} == {r: ([], False) for r in range(3)}


def test_a_rank_that_never_arrives_is_named_within_the_timeout():
    out = _arrive(dist.HashStore(), [0, 1, 3], 4, timeout_s=1.0)
    for rank in (0, 1, 3):
        (missing, late), waited = out[rank]
        assert missing == [2] and not late, (rank, out[rank])
        assert waited < 5.0  # near the timeout, not the store's default (minutes)


def test_a_rank_arriving_after_the_verdict_learns_it_was_counted_missing():
    # rank 1 comes 1.5 s late for a 0.5 s timeout: rank 0 gave up; rank 1 must not go on
    # into the next collective alone (it would hang there)
    store = dist.HashStore()
    out = _arrive(store, [0, 1], 2, timeout_s=0.5, delay_s={1: 1.5})
    assert out[0][0] == ([1], False)
    assert out[1][0] == ([1], True)


def test_messages_name_the_missing_ranks_and_the_late_one():
    msg = _timeout_message([2, 5], False, 0, 6.0)
    assert msg.startswith("autoshard: rank(s) 2, 5 did not reach planning within 6 s")
    assert "raise rank_timeout_s" in msg
    late = _timeout_message([3], True, 3, 6.0)
    assert late.startswith("autoshard: this rank (3) reached planning after the others")


def test_wait_for_all_ranks_raises_the_timeout_error_on_a_process_group(monkeypatch):
    """The process-group wrapper: the default store, this rank, the world size."""
    from autoshard.planning import rank_agreement

    store = dist.HashStore()
    monkeypatch.setattr(rank_agreement, "_arrival_store", lambda: store)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(RankTimeoutError, match=r"rank\(s\) 1 did not reach planning"):
        rank_agreement.wait_for_all_ranks(0.3)


def test_the_arrival_check_issues_no_collective_on_nccl(monkeypatch):
    """On NCCL a barrier is the job's first collective and hangs for a missing rank: the
    check must finish (here: name the missing rank) through the store alone."""
    from autoshard.planning import rank_agreement

    def collective(*args, **kwargs):
        raise AssertionError("the arrival check issued a collective")

    store = dist.HashStore()
    monkeypatch.setattr(rank_agreement, "_arrival_store", lambda: store)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    for name in ("barrier", "monitored_barrier", "all_reduce", "all_gather_object"):
        monkeypatch.setattr(dist, name, collective)
    store.set(f"autoshard/arrived/{rank_agreement._generation + 1}/0", "1")  # rank 0 is here
    with pytest.raises(RankTimeoutError, match=r"rank\(s\) 2 did not reach planning within 0.3 s"):
        rank_agreement.wait_for_all_ranks(0.3)
