"""Pipeline parallelism (autoshard.pipeline, docs/pipeline.md) on 4 gloo ranks: an 8-layer
Llama-style model as pp=2 x dp=2 under torch's Schedule1F1B and as pp=4 under
ScheduleInterleaved1F1B with 2 stages per rank (8 stages of one layer), each stage planned by
autoshard and wrapped as torch's PipelineStage; 3 SGD steps of 4 microbatches must give the
single-process model's losses and parameters under the same gradient accumulation. The pp=4
scenario leaves the mesh and the microbatch count to the planner (plan_pipeline's
mesh="auto"). The sends, receives and collectives that run are counted against the plan's.
Both scenarios run in one torchrun launch (dist/pipeline_worker.py)."""

import pytest

from autoshard import _core
from autoshard.pipeline.stage_split import balanced_split_points, layer_ranges
from conftest import ok_on_every_rank, run_torchrun

STEPS = 3  # dist/pipeline_worker.py's; the first is not counted (shape inference)
ATOL_LOADED = 1e-6  # the pp=2 x dp=2 run's parameters vs the single-process model's

SCENARIOS = [
    {"name": "pp2_dp2_1f1b", "mesh": [2, 2], "schedule": "1F1B", "n_microbatches": 4},
    {  # the planner chooses the mesh (pp=4: 8 stages of one layer) and the microbatches
        "name": "pp4_interleaved",
        "mesh": "auto",
        "world_size": 4,
        "schedule": "Interleaved1F1B",
        "virtual_stages": 2,
    },
]
# what the planner chose where it was left to choose (mesh [pp, dp], microbatches)
CHOSEN = {"pp4_interleaved": ([4, 1], 4)}
for _sc in SCENARIOS:  # Dynamo's capture takes about twice as long on these small stages
    _sc["capture"] = "direct"
# the stages each rank runs: stage s on pipeline rank s % pp (mesh ranks [[0, 1], [2, 3]] for
# pp=2 x dp=2, so ranks 0 and 1 are the two data-parallel ranks of stage 0)
STAGES = {"pp2_dp2_1f1b": [[0], [0], [1], [1]], "pp4_interleaved": [[0, 4], [1, 5], [2, 6], [3, 7]]}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if not hasattr(_core, "plan_graph"):
        pytest.skip("the C++ planner (_core.plan_graph) is not built")
    # the pp=2 x dp=2 run saves its trained model by DCP; the pp=4 run (another split, stages
    # of one layer on one rank each) loads it before its own training
    folder = tmp_path_factory.mktemp("pipeline")
    checkpoint = str(folder / "pp2_dp2_checkpoint")
    scenarios = [dict(sc) for sc in SCENARIOS]
    scenarios[0]["save_checkpoint"] = checkpoint
    scenarios[1]["load_checkpoint"] = {"path": checkpoint, "dp": 2, "n_microbatches": 4}
    return run_torchrun("pipeline_worker.py", scenarios, folder)


@pytest.mark.slow  # ~100 s on a loaded 2-core machine, planning (tracing) most of it
@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_pipeline_trains_like_single_process(results, name):
    runs = ok_on_every_rank(results, name)
    assert [r["stages"] for r in runs] == STAGES[name]
    if name in CHOSEN:
        print(runs[0]["choice"])
        assert (runs[0]["mesh"], runs[0]["n_microbatches"]) == CHOSEN[name]
    for rank, r in enumerate(runs):
        print(
            f"{name} rank {rank}: plan {r['plan_seconds']:.1f} s, step "
            f"{r['step_seconds']:.2f} s, layouts {r['layouts']}"
        )
        print(f"  p2p {r['p2p_ran']}, collectives {r['collectives_ran']}")
        # the communication that ran is the plan's: a send and a receive per microbatch and
        # stage boundary each way, each stage program's collectives once per microbatch
        assert r["p2p_ran"] == r["p2p_planned"]
        assert r["collectives_ran"] == r["collectives_planned"]
        assert r["params_close"], f"rank {rank}: {r['worst']} differs by {r['max_param_err']}"
        assert r["max_param_change"] > 1e-4  # the steps did train
        if r["has_last"]:
            assert r["losses_close"], f"rank {rank}: {r['losses']} vs {r['ref_losses']}"
    # in all: microbatches x stage boundaries x 2 directions x dp ranks, each counted step
    n_stages = 1 + max(s for r in runs for s in r["stages"])
    pp, dp = runs[0]["mesh"]
    sends = sum(r["p2p_ran"].get("isend", 0) for r in runs)
    assert sends == (STEPS - 1) * runs[0]["n_microbatches"] * (n_stages - 1) * 2 * dp
    # every parameter of the model lives on some rank
    names = {n for r in runs for n in r["param_names"]}
    assert len(names) == 3 + 9 * 8
    if name == "pp4_interleaved":  # DCP across splits: pp=2 x dp=2's trained model loaded
        for rank, r in enumerate(runs):
            print(f"  rank {rank} loaded the pp=2 x dp=2 checkpoint: {r['checkpoint']}")
            assert r["checkpoint"]["names"] > 0
            assert r["checkpoint"]["max_err"] <= ATOL_LOADED


def test_layer_ranges():
    assert layer_ranges(8, 2) == [range(0, 4), range(4, 8)]
    assert layer_ranges(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert layer_ranges(8, 3, [2, 7]) == [range(0, 2), range(2, 7), range(7, 8)]
    with pytest.raises(ValueError, match="split points"):
        layer_ranges(8, 3, [5, 5])
    with pytest.raises(ValueError, match="cannot fill"):
        layer_ranges(2, 4)


def test_default_split_balances_flops_with_the_head_on_the_last_stage():
    import torch

    from autoshard.models import Llama, LlamaConfig

    def points(vocab, n_stages):
        cfg = LlamaConfig(dim=32, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=vocab)
        with torch.device("meta"):
            return balanced_split_points(Llama(cfg), n_stages, seq_len=8)

    assert points(64, 2) == [4]  # a small head: as by count
    assert points(64, 4) == [2, 4, 6]
    # a head of 4096 words costs about 14 of these layers: the last stage keeps one layer
    assert points(4096, 2) == [7]
    assert points(1024, 2) == [5]  # ~3.5 layers' worth: 5 + 3 layers and the head
