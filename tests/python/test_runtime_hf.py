"""Runtime paths that the Hugging Face families (python/autoshard/testing/hf_zoo.py)
exercise, on small stand-ins (tests/python/dist/hf_runtime_worker.py), under both runtimes,
gradients compared with the eager model at rtol 1e-5 / atol 1e-6:

- a custom op with its own autograd (like transformers' ``grouped_mm_fallback``), which has no
  DTensor rule and runs replicated, with its weight gradient planned as P(sum): the
  replicated result enters the Partial layout by a local partition (DTensor.redistribute
  refuses R -> P(sum); the DeepSeek-V3-style MoE failed there on a 2x2 mesh);
- transformers' ``grouped_mm_fallback`` and ``histc`` planned by the C++ planner, run on local
  shards in the plan's layouts;
- a convolution with its output channels split (DTensor's own rule splits the batch only, so
  ViT's planned channel split came out in the wrong layout): convolution and
  convolution_backward run on local shards in the plan's layouts, strictly;
- a cache that starts as ``torch.tensor([])`` and grows by ``torch.cat`` (T5 under
  transformers): the trace drops the empty input torch.cat skips (DTensor's cat rule failed
  on it with 2 ranks).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from conftest import DIST_DIR, ok_on_every_rank, run_torchrun


def _worker():
    name = "autoshard_hf_runtime_worker"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DIST_DIR / "hf_runtime_worker.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _has_transformers_op() -> bool:
    try:
        import transformers.integrations.moe  # noqa: F401
    except Exception:
        return False
    return hasattr(torch.ops.transformers, "grouped_mm_fallback")


@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_custom_autograd_op_on_one_rank_matches_eager(mesh1, runtime):
    res = _worker().run_scenario("custom", runtime, mesh1)
    assert res["warnings"].get("replicated:autoshard_test.grouped_mm.default", 0) >= 2, res


@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_conv_on_one_rank_runs_locally_per_plan(mesh1, runtime):
    res = _worker().run_scenario("conv", runtime, mesh1)
    assert res["warnings"].get("local:aten.convolution.default") == 1, res
    assert res["warnings"].get("local:aten.convolution_backward.default") == 1, res


def test_hf_runtime_paths_on_two_ranks(tmp_path):
    scenarios = ["custom", "conv", "cache_cat"] + (
        ["transformers"] if _has_transformers_op() else []
    )
    config = [
        {"name": f"{s}/{rt}", "scenario": s, "runtime": rt, "mesh": [2]}
        for s in scenarios
        for rt in ("program", "interpret")
    ]
    results = run_torchrun("hf_runtime_worker.py", config, tmp_path, nproc=2)
    for sc in config:
        per_rank = ok_on_every_rank(results, sc["name"])
        warnings = per_rank[0]["warnings"]
        if sc["scenario"] == "conv":
            assert warnings.get("local:aten.convolution.default") == 1, warnings
        if sc["scenario"] == "transformers":
            assert warnings.get("local:transformers.grouped_mm_fallback.default") == 2, warnings
