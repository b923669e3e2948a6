"""A DeepSeek-style MoE block (models_zoo.DeepSeekMoEBlock: 8 fine-grained experts, top-2,
shared expert, capacity per group) planned freely on 4 gloo ranks as a (dp, ep) = (2, 2) mesh
under the default parameter budget (costed for the CPU ranks it runs on): the planner picks
expert parallelism (expert weights sharded on E over ep, tokens returned from the experts by
all-to-all), and 3 SGD steps match the single-process model (rtol 1e-5, atol 1e-6), as the
lowered per-rank program and through the reference interpreter.

On gloo, DTensor runs a Shard -> Shard redistribution as all_gather + chunk (torch 2.13,
_collective_utils.shard_dim_alltoall: "CPU process group does not support alltoall"), so the
lowered program issues an all_gather_into_tensor where the plan has an all-to-all (the
plan's cost model counts the all-to-all; gloo itself does run all_to_all_single).
Worker: tests/python/dist/moe_ep_worker.py. Planning at scale: test_moe_expert_parallel.py."""

import pytest

from autoshard import _core
from conftest import ok_on_every_rank, run_torchrun

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

MODEL = {"dim": 128, "hidden": 64, "n_experts": 8, "top_k": 2, "shared_hidden": 128}
BASE = {
    "mesh": [2, 2],
    "dim_names": ["dp", "ep"],
    "model": MODEL,
    "input_shape": [16, 128, 128],
    "hardware": "CPU",
}
SCENARIOS = [dict(BASE, name="ep_program"), dict(BASE, name="ep_interpreted", runtime="interpret")]
EXPERT_WEIGHTS = ("layers.0.w1", "layers.0.w3", "layers.0.w2")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun(
        "moe_ep_worker.py", SCENARIOS, tmp_path_factory.mktemp("moe_ep"), timeout=600
    )


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_expert_parallel_moe_trains_like_single_process(results, name):
    for rank, r in enumerate(ok_on_every_rank(results, name)):
        if rank == 0:
            print(
                f"\n== {name}\n{r['report']}\nlayouts {r['layouts']}\n"
                f"plan {r['plan_seconds']:.1f} s; steps {r['steps']}"
            )
        for i, s in enumerate(r["steps"]):
            assert s["loss_close"], f"rank {rank} step {i}: loss {s['loss']} vs {s['ref_loss']}"
            assert s["params_close"], (
                f"rank {rank} step {i}: {s['worst']} differs by " f"{s['max_param_err']}"
            )
            assert s["grad_layouts_ok"]
        assert r["param_fraction"] <= 0.25 + 1e-9  # the default budget


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_the_plan_is_expert_parallel_with_all_to_all(results, name):
    for rank, r in enumerate(ok_on_every_rank(results, name)):
        for fqn in EXPERT_WEIGHTS:  # experts sharded on E over ep (mesh dim 1)
            assert r["layouts"][fqn][1] == "S(0)", (fqn, r["layouts"][fqn])
        # tokens [E, G, C, D] / [G, E, C, D] exchanged over ep by all-to-all
        a2a = [
            p
            for p in r["planned"]
            if p["kind"] == "all_to_all"
            and p["mesh_dim"] == 1
            and len(p["shape"]) == 4
            and MODEL["n_experts"] in p["shape"][:2]
        ]
        assert a2a, r["planned"]
        assert {r["planned_ops"][p["where"]] for p in a2a} == {"aten.transpose.int"}


def test_the_program_runs_the_all_to_alls_as_gloo_all_gathers(results):
    """The lowered program issues exactly its listed collectives; where the plan has a token
    all-to-all over ep, DTensor's gloo fallback gathers instead (all_gather + chunk)."""
    for rank, r in enumerate(ok_on_every_rank(results, "ep_program")):
        assert r["executed_as_listed"], (r["executed"], r["program_collectives"])
        a2a = {p["where"] for p in r["planned"] if p["kind"] == "all_to_all"}
        at_a2a = [c["op"] for c in r["program_collectives"] if c["where"] in a2a]
        assert at_a2a and set(at_a2a) == {"all_gather_into_tensor"}, r["program_collectives"]
