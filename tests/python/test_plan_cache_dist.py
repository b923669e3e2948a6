"""The plan cache on 2 gloo ranks (dist/plan_cache_worker.py): a hit on every rank loads the
stored plan without solving or broadcasting; a rank without the entry (or without a cache)
gets rank 0's plan, cached or new, broadcast as before; every rank always runs the same
plan."""

import pytest

from autoshard import _core
from conftest import ok_on_every_rank, run_torchrun

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("plan_cache_dist")
    return run_torchrun(
        "plan_cache_worker.py", {"cache_dir": str(base / "cache")}, base, nproc=2, timeout=300
    )


def test_first_plan_is_made_on_rank_0_and_broadcast(results):
    first = ok_on_every_rank(results, "first")
    assert [r["solver_calls"] for r in first] == [1, 0]
    assert all(r["marker"]["hit"] is False for r in first)
    assert len({r["digest"] for r in first}) == 1


def test_a_hit_on_every_rank_skips_the_solver_everywhere(results):
    first = ok_on_every_rank(results, "first")
    again = ok_on_every_rank(results, "again")
    assert [r["solver_calls"] for r in again] == [0, 0]
    assert all(r["marker"] == {"key": first[0]["marker"]["key"], "hit": True} for r in again)
    assert {r["digest"] for r in again} == {first[0]["digest"]}


@pytest.mark.parametrize("name", ["own_dirs", "mixed"])
def test_ranks_without_the_entry_get_rank_0s_cached_plan(results, name):
    first = ok_on_every_rank(results, "first")
    runs = ok_on_every_rank(results, name)
    assert [r["solver_calls"] for r in runs] == [0, 0]
    assert {r["digest"] for r in runs} == {first[0]["digest"]}
    assert runs[0]["marker"]["hit"] is True
