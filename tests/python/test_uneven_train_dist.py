"""Any world size: uneven shards train exactly on 1 to 6 gloo ranks (torchrun).

Models whose sizes do not divide the world (hidden 32 on 3 and 5 ranks, a vocabulary of 50
on 4, 7 heads on 3 and 6, batches of 6 and 10), 1-D meshes and the 2-D meshes of 6 ranks
(2x3, 3x2), the planner's default parameter budget (FSDP-like: parameters sharded into
uneven pieces) and low = high = 1 (replicated): 2 SGD steps, losses and parameters equal
to the single-process model's. test_uneven_ranks.py checks, without running, that every
rank's program issues the same collectives; here they run. Worker: dist/train_worker.py.
"""

import pytest

from autoshard import _core
from conftest import ok_on_every_rank, run_torchrun

pytestmark = [
    pytest.mark.skipif(
        not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
    ),
    pytest.mark.slow,
]


def _scenario(name, model, mesh, **extra):
    # a tiny model's problem is proven optimal in under a second, but the limit also counts
    # tracing, which takes seconds when 6 ranks share 2 cores
    return {
        "name": name,
        "model": model,
        "mesh": mesh,
        "plan": "auto",
        "steps": 2,
        "time_limit_s": 30.0,
        **extra,
    }


GPT32 = "gpt:32:4:64:6"  # hidden 32, 4 heads, vocabulary 64, batch 6
MATRIX = {
    1: [_scenario("gpt32", GPT32, [1])],
    2: [_scenario("gpt_vocab63", "gpt:32:4:63:6", [2])],
    3: [
        _scenario("gpt32", GPT32, [3]),
        _scenario("gpt32_replicated", GPT32, [3], param_memory=[1.0, 1.0]),
        _scenario("gpt32_interpreted", GPT32, [3], runtime="interpret"),
        _scenario("llama_7heads", "llama:28:7:50:6", [3]),
    ],
    4: [_scenario("gpt_vocab50", "gpt:32:4:50:8", [4])],
    5: [_scenario("gpt32", "gpt:32:4:64:10", [5])],
    6: [
        _scenario("gpt32", GPT32, [6]),
        _scenario("gpt32_2x3", GPT32, [2, 3], dim_names=["dp", "tp"]),
        _scenario("llama_7heads_3x2", "llama:28:7:50:6", [3, 2], dim_names=["dp", "tp"]),
    ],
}


@pytest.mark.parametrize("world", sorted(MATRIX))
def test_uneven_shards_train_like_one_process(world, tmp_path):
    scenarios = MATRIX[world]
    results = run_torchrun("train_worker.py", scenarios, tmp_path, nproc=world, timeout=600)
    for sc in scenarios:
        for rank, r in enumerate(ok_on_every_rank(results, sc["name"])):
            for k, step in enumerate(r["steps"]):
                assert step["loss_close"] and step["params_close"], (
                    f"{sc['name']} rank {rank} step {k}: loss {step['loss']} vs "
                    f"{step['ref_loss']}, worst parameter {step['worst']} "
                    f"({step['max_param_err']:.2e})\n{r['report']}"
                )
