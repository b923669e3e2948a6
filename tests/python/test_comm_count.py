"""No redundant communication: on 4 gloo ranks (torchrun), one training step of a planned
module issues exactly the collectives its plan lists - in particular the gradient of a
replicated weight used as ``x @ w.t()`` with a batch-sharded ``x`` is all-reduced exactly once,
where the plan says, also when the plan keeps it Partial through a transpose (the value
reduced is then a non-contiguous view). Checked for the lowered program (its graphs' collectives
are the plan's, and exactly those run) and for the reference interpreter. Worker: tests/python/dist/comm_count_worker.py.
"""

import math
from collections import Counter

import pytest

from autoshard import _core
from conftest import ok_on_every_rank, run_torchrun

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

SCENARIOS = [
    {"name": "planner_choice", "mesh": [4]},
    {"name": "partial_through_transpose", "mesh": [4], "partial_through_transpose": True},
    {"name": "planner_choice_interpreted", "mesh": [4], "runtime": "interpret"},
    {"name": "cross_entropy", "mesh": [4], "loss": "cross_entropy"},
    # logits large enough that the count's all-reduce is issued at the top of the forward
    # on its own (not merged with the loss sum's), with ignored targets on two ranks
    {
        "name": "cross_entropy_wide",
        "mesh": [4],
        "loss": "cross_entropy",
        "classes": 1024,
        "ignored": [1, 6],
    },
    {
        "name": "cross_entropy_interpreted",
        "mesh": [4],
        "loss": "cross_entropy",
        "runtime": "interpret",
    },
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun(
        "comm_count_worker.py", SCENARIOS, tmp_path_factory.mktemp("comm"), timeout=300
    )


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_collectives_issued_are_exactly_the_planned_redistributions(results, name):
    for rank, r in enumerate(ok_on_every_rank(results, name)):
        # a fused collective (fuse_reductions.py) stands for the planned ones it replaced
        issued = Counter(
            (m, c["kind"]) for c in r["collectives"] for m in c.get("members", [c["where"]])
        )
        planned = Counter((p["where"], p["kind"]) for p in r["planned"])
        assert issued == planned, (
            f"rank {rank}: issued {r['collectives']}\nplanned " f"{r['planned']}\n{r['report']}"
        )
        assert r["executed_as_listed"], f"rank {rank}: the program ran other collectives"
        assert r["loss_close"] and r["grad_close"], f"rank {rank}: wrong numerics"
        assert r["param_layout"] == ["R"] and r["grad_placements"] == ["R"]


def test_the_backward_reuses_the_loss_normaliser_the_forward_reduced(results):
    """Cross-entropy's mean divides by the count of targets, all-reduced in the forward; the
    backward needs the same replicated scalar and takes the forward's instead of reducing it
    again (a blocking round trip at the start of the backward)."""
    for rank, r in enumerate(ok_on_every_rank(results, "cross_entropy")):
        scalars = [c for c in r["collectives"] if c["numel"] <= 2]
        assert scalars and all(
            c["phase"] == "forward" for c in scalars
        ), f"rank {rank}: {r['collectives']}"


def test_the_loss_sum_and_its_normaliser_are_reduced_in_one_round_trip(results):
    """The lowered program all-reduces the loss sum and the target count together
    (fuse_reductions.py): one blocking scalar collective per step instead of two."""
    for rank, r in enumerate(ok_on_every_rank(results, "cross_entropy")):
        scalars = [c for c in r["collectives"] if c["numel"] <= 2]
        assert len(scalars) == 1 and scalars[0]["numel"] == 2, f"rank {rank}: {r['collectives']}"
        assert len(scalars[0]["members"]) == 2


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_weight_gradient_is_reduced_exactly_once_where_the_plan_says(results, name):
    for rank, r in enumerate(ok_on_every_rank(results, name)):
        w_numel = r["w_numel"]
        reductions = [
            c
            for c in r["collectives"]
            if c["kind"] in ("all_reduce", "reduce_scatter") and c["numel"] == w_numel
        ]
        planned = [
            p
            for p in r["planned"]
            if p["kind"] == "all_reduce" and math.prod(p["shape"]) == w_numel
        ]
        assert len(planned) == 1, r["planned"]
        assert len(reductions) == 1, (
            f"rank {rank}: gradient reduced {len(reductions)} times: " f"{r['collectives']}"
        )
        assert reductions[0]["where"] == planned[0]["where"]
        if r["pinned"]:  # the Partial went through the pinned transpose before being reduced
            assert planned[0]["where"] != r["pinned"] and planned[0]["src"] == ["P(sum)"]


def test_the_wide_loss_divides_the_gradients_at_the_end_of_the_backward(results):
    """late_loss_scale.py: the forward does not wait for the count of targets; the backward
    divides the reduced gradient by it at its end, and the numerics stay the single
    process's (checked for every scenario above) with ranks counting different numbers.
    Nothing waiting for the count early, it is all-reduced with the loss sum: one scalar
    round trip a step."""
    for rank, r in enumerate(ok_on_every_rank(results, "cross_entropy_wide")):
        assert r["late_loss_scale"] == 1, f"rank {rank}: not rewritten"
        assert r["loss_close"] and r["grad_close"], f"rank {rank}: wrong numerics"
        scalars = [c for c in r["collectives"] if c["numel"] <= 2]
        assert [(c["phase"], c["numel"]) for c in scalars] == [("forward", 2)], scalars
