"""The runtime with hand-made plans on 4 gloo ranks: every plan must train exactly like the
single-process model (loss at every step, parameters after every step)."""

import pytest

from conftest import by_name, run_torchrun

SCENARIOS = [
    {"name": "mlp_replicate", "model": "mlp", "mesh": [4], "plan": "replicate"},
    {"name": "mlp_ddp", "model": "mlp", "mesh": [4], "plan": "ddp"},
    {"name": "mlp_fsdp", "model": "mlp", "mesh": [4], "plan": "fsdp"},
    {"name": "mlp_fsdp_strict", "model": "mlp", "mesh": [4], "plan": "fsdp", "record_strict": True},
    {"name": "llama_fsdp", "model": "llama", "mesh": [4], "plan": "fsdp"},
    {
        "name": "llama_dp_tp",
        "model": "llama",
        "mesh": [2, 2],
        "plan": "tp",
        "dim_names": ["dp", "tp"],
        "record_strict": True,
    },
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun("train_worker.py", SCENARIOS, tmp_path_factory.mktemp("rt"))


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_hand_plan_trains_like_single_process(results, name):
    for rank, res in enumerate(results):
        r = by_name(res)[name]
        assert r["ok"], f"rank {rank}: {r.get('traceback', r.get('error'))}"
        assert r["isinstance"] and r["state_dict_keys_match"]
        print(f"{name} rank {rank}: layouts {r['layouts']} warnings {r['warnings']}")
        for i, s in enumerate(r["steps"]):
            assert s["loss_close"], f"step {i}: loss {s['loss']} vs {s['ref_loss']}"
            assert s["params_close"], f"step {i}: {s['worst']} differs by {s['max_param_err']}"
            assert s["grad_types"] == ["DTensor"] and s["grad_layouts_ok"]


def test_fsdp_plan_holds_a_quarter(results):
    r = by_name(results[0])["mlp_fsdp"]
    # every MLP parameter's first dim (32 or 16) divides by 4, so each rank holds 1/4
    assert r["param_fraction"] == pytest.approx(0.25)
    assert all(l == ["S(0)"] for l in r["layouts"].values())


def test_tp_plan_shards_linear_weights_on_tp(results):
    r = by_name(results[0])["llama_dp_tp"]
    assert r["layouts"]["layers.0.attention.wq.weight"] == ["R", "S(0)"]
    assert r["layouts"]["layers.1.feed_forward.w2.weight"] == ["R", "S(1)"]
