"""The planner's memory prediction (plan summary.memory, cpp/src/lowering/step_memory.cpp)
against what each of 4 gloo ranks holds over one training step (tests/python/dist/
memory_worker.py): the bytes the program keeps for the backward and the peak of live bytes,
parameters, buffers and inputs included.

Within 10 % for the Llama-style model and GPT-2. Not yet for the MoE block and ViT: the peak
is under-predicted by about a quarter (transients of their backward that the model does not
see), and ViT's saved bytes by a tenth; their bounds below hold what is measured now, so a
change that widens the gap fails."""

import pytest

from conftest import ok_on_every_rank, run_torchrun

# model -> (bound on |measured / predicted - 1| for the peak, for the saved bytes)
BOUNDS = {"llama": (0.10, 0.10), "gpt2": (0.10, 0.10), "moe": (0.25, 0.10), "vit": (0.30, 0.15)}

pytestmark = pytest.mark.slow


def test_predicted_memory_matches_what_each_rank_holds(tmp_path):
    config = [{"name": m, "model": m} for m in BOUNDS]
    results = run_torchrun("memory_worker.py", config, tmp_path, nproc=4, timeout=600)
    for model, (peak_bound, saved_bound) in BOUNDS.items():
        for rank, r in enumerate(ok_on_every_rank(results, model)):
            measured, predicted = r["measured"], r["predicted"]
            peak = measured["peak"] / predicted["peak"]
            saved = measured["saved"] / predicted["saved"]
            where = f"{model} rank {rank}: measured {measured}, predicted {predicted}"
            assert abs(peak - 1) <= peak_bound, where
            assert abs(saved - 1) <= saved_bound, where
