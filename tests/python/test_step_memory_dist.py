"""The planner's memory prediction (plan summary.memory, cpp/src/lowering/step_memory.cpp)
against what each of 4 gloo ranks holds over one training step (tests/python/dist/
memory_worker.py): the bytes the program keeps for the backward and the peak of live bytes,
parameters, buffers and inputs included.

Within 10 % for the Llama-style model, GPT-2, the MoE block and ViT (measured peaks: +0.1 %,
+0.1 %, +2 to +7 % by rank, +6 %; saved bytes within 0.2 % for all four)."""

import pytest

from conftest import ok_on_every_rank, run_torchrun

# model -> (bound on |measured / predicted - 1| for the peak, for the saved bytes)
BOUNDS = {"llama": (0.10, 0.10), "gpt2": (0.10, 0.10), "moe": (0.10, 0.10), "vit": (0.10, 0.10)}

pytestmark = pytest.mark.slow


# the Llama-style model under a limit that its fastest plan, and the plan the solver shards
# to the limit, exceed without recomputation (bench/memory.py measures the same limit)
LIMIT = 5 << 20


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    config = [{"name": m, "model": m} for m in BOUNDS]
    config.append({"name": "llama_limited", "model": "llama", "limit": LIMIT, "reference": True})
    out = tmp_path_factory.mktemp("memory")
    return run_torchrun("memory_worker.py", config, out, nproc=4, timeout=900)


def test_predicted_memory_matches_what_each_rank_holds(results):
    for model, (peak_bound, saved_bound) in BOUNDS.items():
        for rank, r in enumerate(ok_on_every_rank(results, model)):
            measured, predicted = r["measured"], r["predicted"]
            peak = measured["peak"] / predicted["peak"]
            saved = measured["saved"] / predicted["saved"]
            where = f"{model} rank {rank}: measured {measured}, predicted {predicted}"
            assert abs(peak - 1) <= peak_bound, where
            assert abs(saved - 1) <= saved_bound, where


def test_a_plan_recomputes_part_of_the_forward_to_fit_the_limit(results):
    """Issue 42's acceptance 2: the plan recomputes (not every forward node), fits the limit
    by prediction and by measurement (the step's peak plus the optimizer state it will
    hold), within 10 % of the prediction, and equals the single-process model."""
    for rank, r in enumerate(ok_on_every_rank(results, "llama_limited")):
        where = f"rank {rank}: {r}"
        levels = set(r["recompute"]["blocks"].values())
        assert r["recompute"]["fits"] and levels and levels != {"full"}, where
        assert r["recomputed_nodes"] > 0, where
        measured, predicted = r["measured"], r["predicted"]
        assert measured["peak"] + predicted["optimizer_state"] <= LIMIT, where
        assert abs(measured["peak"] / predicted["peak"] - 1) <= 0.10, where
        assert abs(measured["saved"] / predicted["saved"] - 1) <= 0.10, where
        for name, err in r["errors"].items():
            assert err <= 1e-5, f"{name}: {err} ({where})"


def test_without_recomputation_no_plan_fits_that_limit():
    """The same model, mesh and limit with recompute='none': the planner's layouts alone
    (with the solver holding the limit) do not fit it by the same prediction."""
    import torch

    from autoshard.planning.graph_export import graph_json
    from autoshard.planning.options import PlannerOptions, plan_graph
    from autoshard.trace.tracer import trace_training_step
    from autoshard._testing.models_zoo import llama3_memory

    with torch.device("meta"):
        model = llama3_memory()  # memory_worker's
    tokens = lambda: (
        torch.zeros(8, 64, dtype=torch.long),
        torch.zeros(8, 64, dtype=torch.long),
    )  # noqa: E731
    step = trace_training_step(model, tokens)
    layouts = {n: ["S(0)"] for n in step.input_nodes if n}
    options = PlannerOptions(
        mesh_shape=[4],
        hardware="CPU",
        input_constraints=layouts,
        memory_limit_bytes=LIMIT,
        recompute="none",
    )
    try:
        memory = plan_graph(graph_json(step), options)["summary"]["memory"]
    except RuntimeError as e:  # proven infeasible: no layouts fit
        assert "memory" in str(e), e
        return
    assert memory["peak_bytes"] > LIMIT, memory
