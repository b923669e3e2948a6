"""The Megatron-style baseline (autoshard._testing.baselines) against autoshard's own plan.

A Llama with the real Llama-3-8B dims but 2 layers is traced on fake process groups of
(dp=8, tp=8) and (dp=2, tp=4) H100s and planned twice under the same cost model: with the
Megatron pins (TP + SP + FSDP + DP) and without them. autoshard's plan must never be worse
than the Megatron one (its search space contains it; same parameter-memory budget and
memory limit). Both totals are printed (run pytest with -s to see them)."""

import json
import math

import pytest

from autoshard import _core
from autoshard._testing.baselines import (
    BaselineError,
    compare_with_megatron,
    megatron_pins,
    parameter_bytes,
    trace_llama,
)
from autoshard.models import LlamaConfig, llama3_8b_config

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

H100_MEMORY = 80 * 10**9
TOLERANCE = 1e-6  # relative: the two runs price plans with the same code, so ties are exact


def _tiny_cfg(layers=2):
    return LlamaConfig(
        dim=64,
        n_layers=layers,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=128,
        ffn_dim=128,
        max_seq_len=16,
        attention="sdpa",
    )


@pytest.fixture(scope="module")
def tiny_graph():
    return trace_llama(_tiny_cfg(), (2, 2), batch=4)


# ---- the pins themselves ------------------------------------------------------------------

# Weight layouts of the recipe on a (dp, tp) mesh, by the module that owns the weight.
EXPECTED_WEIGHTS = {
    "wq": ["S(1)", "S(0)"],
    "wk": ["S(1)", "S(0)"],
    "wv": ["S(1)", "S(0)"],
    "w1": ["S(1)", "S(0)"],
    "w3": ["S(1)", "S(0)"],
    "output": ["S(1)", "S(0)"],
    "wo": ["S(0)", "S(1)"],
    "w2": ["S(0)", "S(1)"],
    "attention_norm": ["S(0)", "R"],
    "ffn_norm": ["S(0)", "R"],
    "norm": ["S(0)", "R"],
    "tok_embeddings": ["S(0)", "S(1)"],
}


def test_pins_follow_the_recipe(tiny_graph):
    g = json.loads(tiny_graph.graph_json)
    pins = megatron_pins(g)
    by_name = {n["name"]: n for n in g["nodes"]}
    params = [n for n in g["nodes"] if n.get("role") == "parameter"]
    assert len(params) == 2 * 9 + 3
    for p in params:
        owner = p["fqn"].split(".")[-2]
        assert pins.node_constraints[p["name"]] == EXPECTED_WEIGHTS[owner], p["fqn"]
    inputs = [n["name"] for n in g["nodes"] if n.get("role") == "input"]
    assert pins.input_constraints == {name: ["S(0)", "R"] for name in inputs}

    def pinned(kind):
        return sorted(name for name, why in pins.reasons.items() if why.startswith(kind))

    fwd_mm = [n for n in g["nodes"] if n["op"] == "aten.mm.default" and n["phase"] == "forward"]
    column = [
        n["name"]
        for n in fwd_mm
        if n["module"].split(".")[-1] in ("wq", "wk", "wv", "w1", "w3", "output")
    ]
    row = [n["name"] for n in fwd_mm if n["module"].split(".")[-1] in ("wo", "w2")]
    assert len(column) == 2 * 5 + 1 and len(row) == 2 * 2
    assert pinned("column") == sorted(column)
    assert pinned("row") == sorted(row)
    for name in column:
        assert pins.node_constraints[name] == ["S(0)", "S(1)"]
    for name in row:
        assert pins.node_constraints[name] == ["S(0)", "P(sum)"]
    # two residual adds per block, sequence-sharded; the norms' outputs gathered on tp
    residual = pinned("residual")
    assert len(residual) == 2 * 2
    for name in residual:
        assert by_name[name]["op"] == "aten.add.Tensor"
        assert pins.node_constraints[name] == ["S(0)", "S(1)"]
    norms = pinned("norm")
    assert len(norms) == 2 * 2 + 1
    for name in norms:
        assert by_name[name]["op"] == "aten.mul.Tensor"  # x * rsqrt(...) * weight
        assert pins.node_constraints[name] == ["S(0)", "R"]
    attention = pinned("attention")
    assert len(attention) == 2
    for name in attention:
        assert pins.node_constraints[name] == ["S(0)", "S(1)"]  # heads on tp


def test_batch_split_variant_moves_only_the_residual_stream(tiny_graph):
    seq = megatron_pins(tiny_graph.graph_json)
    batch = megatron_pins(tiny_graph.graph_json, sp_dim=0)
    assert seq.node_constraints.keys() == batch.node_constraints.keys()
    for name, layout in seq.node_constraints.items():
        if seq.reasons[name].startswith("residual"):
            assert layout == ["S(0)", "S(1)"] and batch.node_constraints[name] == ["S(0)", "S(0)"]
        else:
            assert batch.node_constraints[name] == layout, name
    with pytest.raises(BaselineError, match="sp_dim"):
        megatron_pins(tiny_graph.graph_json, sp_dim=2)


def test_pins_follow_mesh_dim_names(tiny_graph):
    pins = megatron_pins(tiny_graph.graph_json, mesh_dim_names=("tp", "dp"))
    g = json.loads(tiny_graph.graph_json)
    wq = next(n["name"] for n in g["nodes"] if n.get("fqn") == "layers.0.attention.wq.weight")
    assert pins.node_constraints[wq] == ["S(0)", "S(1)"]  # (tp, dp) order
    assert set(map(tuple, pins.input_constraints.values())) == {("R", "S(0)")}


def test_pins_reject_what_they_cannot_express(tiny_graph):
    with pytest.raises(BaselineError, match="2-d"):
        megatron_pins(tiny_graph.graph_json, mesh_ndim=1, mesh_dim_names=("dp",))
    with pytest.raises(BaselineError, match="dp_name/tp_name"):
        megatron_pins(tiny_graph.graph_json, mesh_dim_names=("data", "model"))
    g = json.loads(tiny_graph.graph_json)
    for n in g["nodes"]:
        if n.get("fqn") == "layers.0.attention.wq.weight":
            n["fqn"] = "layers.0.attention.q_proj.weight"
    with pytest.raises(BaselineError, match="q_proj"):
        megatron_pins(g)


def test_tiny_megatron_plan_keeps_its_pins(tiny_graph):
    c = compare_with_megatron(tiny_graph.graph_json, (2, 2), time_limit_s=5.0)
    assert set(c.variants) == {"sp=seq", "sp=batch"}
    assert c.megatron.total_us == min(v.total_us for v in c.variants.values())
    for label, sp_dim in (("sp=seq", 1), ("sp=batch", 0)):
        plan = c.variants[label].plan
        for name, layout in megatron_pins(
            tiny_graph.graph_json, sp_dim=sp_dim
        ).node_constraints.items():
            assert plan["nodes"][name]["outputs"][0] == layout, (label, name)
    # Parameter bytes per GPU by hand: 2-d weights split 4 ways, norm weights 2 ways (dp).
    g = json.loads(tiny_graph.graph_json)
    expected = 0
    for n in g["nodes"]:
        if n.get("role") == "parameter":
            numel = math.prod(n["outputs"][0]["shape"])
            expected += 4 * (numel // 4 if len(n["outputs"][0]["shape"]) == 2 else numel // 2)
    assert c.megatron.parameter_bytes_per_gpu == expected
    assert parameter_bytes(g) == 4 * tiny_graph.parameters
    assert c.autoshard.parameter_bytes_per_gpu <= expected
    assert c.autoshard.total_us <= c.megatron.total_us * (1 + TOLERANCE)


# ---- Llama-3-8B dims, 2 layers ------------------------------------------------------------


@pytest.mark.parametrize("mesh_shape", [(8, 8), (2, 4)], ids=["dp8xtp8", "dp2xtp4"])
def test_autoshard_never_worse_than_megatron(mesh_shape):
    dp, tp = mesh_shape
    traced = trace_llama(llama3_8b_config(n_layers=2, seq_len=2048), mesh_shape, batch_per_dp=8)
    c = compare_with_megatron(
        traced.graph_json,
        mesh_shape,
        hardware="H100",
        memory_limit_bytes=H100_MEMORY,
        time_limit_s=3.0,
    )
    print(
        f"\nLlama-3-8B dims, 2 layers, batch {8 * dp} x 2048, (dp={dp}, tp={tp}) H100 "
        f"(traced in {traced.trace_seconds:.1f} s):\n{c.report()}"
    )
    assert c.megatron.total_us > 0 and c.autoshard.total_us > 0
    # equal memory: autoshard was held to the Megatron plan's parameter bytes
    assert c.autoshard.parameter_bytes_per_gpu <= c.megatron.parameter_bytes_per_gpu * (
        1 + TOLERANCE
    )
    for label, figures in c.variants.items():
        assert c.autoshard.total_us <= figures.total_us * (1 + TOLERANCE), (label, c.report())
