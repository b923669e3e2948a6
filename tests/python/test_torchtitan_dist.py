"""torchtitan 0.3's own models train under autoshard like one process (issue 43): the debug
models with FlexAttention, called as torchtitan's trainer calls them (tokens, positions and a
causal BlockMask from create_block_mask, or torchtitan's packed-document mask), planned by
AutoParallel on 4 gloo ranks (2x2) and trained 3 SGD steps; losses and parameters equal to the single-process model's with the same
attention math (FlexAttention's dense math on CPU) at rtol 1e-4. Worker:
dist/torchtitan_worker.py."""

import importlib.util

import pytest

from autoshard import _core
from conftest import ok_on_every_rank, run_torchrun

pytestmark = [
    pytest.mark.skipif(
        not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("torchtitan") is None,
        reason="torchtitan is not installed (scripts/setup.sh installs its model code)",
    ),
    pytest.mark.slow,
]

SCENARIOS = [
    {"name": "llama3_causal", "model": "llama3", "mesh": [2, 2], "steps": 3},
    {"name": "qwen3_causal", "model": "qwen3", "mesh": [2, 2], "steps": 3},
    # torchtitan's own packed-document mask (model.get_attention_masks over positions that
    # restart at each document): its mask_mod captures a table, a graph input per step
    {"name": "llama3_document", "model": "llama3", "mesh": [2, 2], "steps": 3, "mask": "document"},
]


def test_torchtitan_flex_models_train_like_one_process(tmp_path):
    results = run_torchrun("torchtitan_worker.py", SCENARIOS, tmp_path, nproc=4, timeout=900)
    for sc in SCENARIOS:
        for rank, res in enumerate(ok_on_every_rank(results, sc["name"])):
            assert len(res["steps"]) == 3
            for step in res["steps"]:
                assert step["loss_close"] and step["params_close"], (sc["name"], rank, step)
            # the attention ran on local shards in the planned layouts, forward and backward
            warnings = res["warnings"]
            assert warnings.get("local:higher_order.flex_attention") == 2, warnings
            assert warnings.get("local:higher_order.flex_attention_backward") == 2, warnings
            sharded = [e for e in res["flex_layouts"].values() if e["inputs"][0] != ["R", "R"]]
            assert sharded, res["flex_layouts"]  # the attention is split over some mesh dim
