"""4 gloo ranks: ranks that trace different models or add different constraints are stopped
with a message naming what differs and on which ranks, and a rank that never arrives is
named by the others after rank_timeout_s instead of leaving them blocked. Random ops whose
values are replicated over ranks need equally seeded ranks (rng_check.py)."""

import pytest

from autoshard import _core
from conftest import by_name, run_torchrun

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

SCENARIOS = [
    {"name": "same", "kind": "same", "timeout_s": 30.0},
    {"name": "eval", "kind": "eval", "timeout_s": 30.0},
    {"name": "hidden", "kind": "hidden", "odd_rank": 3, "timeout_s": 30.0},
    {"name": "layers", "kind": "layers", "odd_rank": 3, "timeout_s": 30.0},
    {"name": "constraint", "kind": "constraint", "odd_rank": 1, "timeout_s": 30.0},
    {"name": "random_same_seed", "kind": "random_same_seed", "timeout_s": 30.0},
    {"name": "random_other_seeds", "kind": "random_other_seeds", "timeout_s": 30.0},
    {"name": "stall", "kind": "stall", "odd_rank": 3, "timeout_s": 6.0},  # last: see worker
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun(
        "rank_check_worker.py", SCENARIOS, tmp_path_factory.mktemp("rc"), timeout=300
    )


def _each_rank(results, name):
    return [by_name(res)[name] for res in results]


def test_ranks_that_agree_plan(results):
    for rank, r in enumerate(_each_rank(results, "same")):
        assert r["ok"], f"rank {rank}: {r.get('error')}"


def test_eval_mode_on_sharded_parameters_matches_the_eval_model(results):
    for rank, r in enumerate(_each_rank(results, "eval")):
        assert r["ok"], f"rank {rank}: {r.get('error')}"
        assert r["eval_no_grad_close"] and r["eval_grad_close"], (rank, r)
        assert r["train_has_graph"]


@pytest.mark.parametrize("name", ["hidden", "layers"])
def test_different_models_stop_every_rank_naming_the_graph(results, name):
    for rank, r in enumerate(_each_rank(results, name)):
        assert not r["ok"] and r["type"] == "RankMismatchError", (rank, r)
        msg = r["error"]
        print(f"rank {rank}: {msg}")
        assert "the traced graph differs (ranks 0, 1, 2:" in msg and "; rank 3:" in msg
        assert "every rank must build the same model" in msg
        assert "constraints differ" not in msg and "options differ" not in msg


def test_different_constraints_name_the_constraints_and_ranks(results):
    for rank, r in enumerate(_each_rank(results, "constraint")):
        assert not r["ok"] and r["type"] == "RankMismatchError", (rank, r)
        msg = r["error"]
        assert "the constraints differ (ranks 0, 2, 3:" in msg and "; rank 1:" in msg
        assert "parameter memory" in msg and "graph differs" not in msg


def test_a_stalled_rank_is_named_after_the_timeout(results):
    for rank, r in enumerate(_each_rank(results, "stall")[:3]):
        assert not r["ok"] and r["type"] == "RankTimeoutError", (rank, r)
        print(f"rank {rank}: {r['error']}")
        assert r["error"].startswith("autoshard: rank(s) 3 did not reach planning within 6 s")
        assert r["seconds"] < 30  # gave up near the timeout, not the process group's


def test_replicated_random_ops_run_when_ranks_are_seeded_alike(results):
    for rank, r in enumerate(_each_rank(results, "random_same_seed")):
        assert r["ok"] and "random_error" not in r, (rank, r)
        assert len(set(r["random_losses"])) == 1, r  # the same dropout mask on every rank


def test_replicated_random_ops_stop_ranks_seeded_apart(results):
    for rank, r in enumerate(_each_rank(results, "random_other_seeds")):
        msg = r.get("random_error", "")
        print(f"rank {rank}: {msg}")
        assert "have different random generator states" in msg, (rank, r)
        assert "Seed every rank alike" in msg and "mesh dim 0" in msg
