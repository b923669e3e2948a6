"""Presets (presets.py): their constraints per mesh, clear errors, and their plans through the
API (AutoParallel(preset=...)) and the command line (autoshard plan --preset)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from autoshard.planning.options import PlannerOptions
from autoshard.planning.presets import PresetError, graph_options, resolve


def test_constraints_per_preset():
    assert resolve("ddp", [4], ["dp"]).parameter_memory == (1.0, 1.0)
    fsdp = resolve("fsdp", [2, 4], None)
    assert fsdp.batch_layout == ("S(0)", "S(0)") and fsdp.parameter_memory == (0.0, 1 / 8)
    hsdp = resolve("HSDP", [2, 4], ["dp_replicate", "dp_shard"])
    assert hsdp.parameter_layout == ("R", "S(0)") and hsdp.parameter_memory is None
    tp = resolve("tp", [2, 4], ["dp", "tp"])
    assert tp.batch_layout == ("S(0)", "R")
    assert tp.parameter_memory[0] == 1 / 4 and 1 / 4 < tp.parameter_memory[1] < 0.26
    assert resolve("fsdp+tp", [2, 4], ["dp", "tp"]).parameter_memory == (0.0, 1 / 8)
    assert resolve(None, [4], None) is None


def test_a_cp_dim_splits_the_sequence_in_any_preset():
    from autoshard.planning.presets import input_layouts

    shapes = [[8, 256], [8], []]  # tokens [batch, seq], a per-sample vector, a scalar
    fsdp = resolve("fsdp", [2, 4], ["dp", "cp"])
    assert fsdp.parameter_memory == (0.0, 1 / 8)  # FSDP over dp x cp
    assert input_layouts(fsdp, shapes) == [["S(0)", "S(1)"], ["S(0)", "R"], None]
    assert input_layouts(resolve("ddp", [4], ["cp"]), shapes)[:2] == [["S(1)"], ["R"]]
    hsdp = resolve("hsdp", [2, 2, 2], ["dp_replicate", "dp_shard", "cp"])
    assert hsdp.parameter_layout == ("R", "S(0)", "R")
    assert hsdp.sequence_layout == ("S(0)", "S(0)", "S(1)")
    tp = resolve("fsdp+tp", [2, 2, 2], ["dp", "cp", "tp"])
    assert tp.sequence_layout == ("S(0)", "S(1)", "R") and tp.parameter_memory == (0.0, 1 / 8)
    with pytest.raises(PresetError, match="more than one dim 'cp'"):
        resolve("fsdp", [2, 2], ["cp", "cp"])


@pytest.mark.parametrize(
    "name,shape,names,needle",
    [
        ("zero3", [4], None, "unknown preset 'zero3'; choose one of ddp, fsdp, hsdp, tp, fsdp+tp"),
        ("ddp", [2, 2], ["dp", "tp"], "has a 'tp' dim; use preset 'tp' or 'fsdp+tp'"),
        ("hsdp", [8], ["dp"], "needs a 2-D (replicate, shard) mesh"),
        ("tp", [2, 2], None, "needs a mesh dim named 'tp'"),
        ("fsdp+tp", [4], ["tp"], "needs a data-parallel dim besides 'tp'"),
    ],
)
def test_errors_name_the_misfit(name, shape, names, needle):
    with pytest.raises(PresetError) as e:
        resolve(name, shape, names)
    assert needle in str(e.value)


@pytest.fixture(scope="module")
def mlp_graph(tmp_path_factory):
    from autoshard.planning.graph_export import graph_json
    from autoshard.models import MLP
    from autoshard.trace.tracer import trace_training_step

    with torch.device("meta"):
        model = MLP(dim=32, hidden=64, layers=2)
    step = trace_training_step(
        model, lambda: (torch.empty(16, 32), torch.empty(16, 32)), torch.device("cpu")
    )
    path = tmp_path_factory.mktemp("graph") / "mlp.json"
    path.write_text(graph_json(step))
    return path


@pytest.mark.parametrize(
    "preset,mesh,names,share",
    [
        ("ddp", "4", "dp", 1.0),
        ("fsdp", "4", "dp", 0.25),
        ("hsdp", "2x2", "r,s", 0.5),
        ("tp", "2x2", "dp,tp", 0.5),
        ("fsdp+tp", "2x2", "dp,tp", 0.25),
    ],
)
def test_cli_plan_with_preset(mlp_graph, tmp_path, capsys, preset, mesh, names, share):
    from autoshard.tools.cli import main

    out = tmp_path / "plan.json"
    rc = main(
        [
            "plan",
            str(mlp_graph),
            "--mesh",
            mesh,
            "--dim-names",
            names,
            "--preset",
            preset,
            "--time-limit",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    plan = json.loads(out.read_text())
    assert plan["preset"] == preset and "node_info" in plan
    graph = json.loads(mlp_graph.read_text())
    total = sum(
        4 * math.prod(n["outputs"][0]["shape"])  # float32 parameters
        for n in graph["nodes"]
        if n.get("role") == "parameter"
    )
    frac = plan["summary"]["parameter_bytes_per_gpu"] / total
    assert share - 1e-9 <= frac <= share * 1.02 + 1e-9
    shape = [int(x) for x in mesh.split("x")]
    for name, layout in graph_options(
        resolve(preset, shape, names.split(",")), graph, PlannerOptions(mesh_shape=shape)
    ).input_constraints.items():
        assert plan["nodes"][name]["outputs"][0] == layout


def test_cli_preset_errors(mlp_graph, capsys):
    from autoshard.tools.cli import main

    assert main(["plan", str(mlp_graph), "--mesh", "4", "--preset", "tp"]) == 2
    assert "needs a mesh dim named 'tp'" in capsys.readouterr().err


def test_autoparallel_preset():
    from autoshard import AutoParallel
    from autoshard.trace.fake_pg import fake_world
    from autoshard.models import MLP

    with torch.device("meta"):
        model = MLP(dim=32, hidden=64, layers=2)
    inputs = lambda: (torch.empty(16, 32), torch.empty(16, 32))  # noqa: E731
    with fake_world((2, 2), ("dp", "tp")) as mesh:
        with pytest.raises(PresetError, match="splits the batch over every mesh dim"):
            AutoParallel(model, inputs, mesh, preset="ddp")  # refused before tracing
        with AutoParallel(model, inputs, mesh, preset="fsdp+tp", time_limit_s=2) as autop:
            autop.optimize_placement()
            plan = autop.plan
    for name in autop.step.input_nodes:
        assert plan["nodes"][name]["outputs"][0] == ["S(0)", "R"]
    assert plan["summary"]["parameter_bytes_per_gpu"] > 0


def test_autoparallel_preset_with_a_cp_dim():
    """The inputs' sequence split over cp, traced in load-balanced order (the permutation is
    in the graph: an index_select of each sequence input)."""
    from autoshard import AutoParallel
    from autoshard.models import Llama, LlamaConfig
    from autoshard.trace.fake_pg import fake_world

    cfg = LlamaConfig(dim=16, n_layers=1, n_heads=2, vocab_size=32, ffn_dim=32, max_seq_len=16)
    with torch.device("meta"):
        model = Llama(cfg)
    inputs = lambda: tuple(torch.zeros(2, 16, dtype=torch.long) for _ in range(2))  # noqa: E731
    with fake_world((2, 2), ("dp", "cp")) as mesh:
        with AutoParallel(model, inputs, mesh, preset="fsdp", time_limit_s=2) as autop:
            autop.optimize_placement()
            plan = autop.plan
    assert autop.step.load_balance.n == 2
    for name in autop.step.input_nodes:
        assert plan["nodes"][name]["outputs"][0] == ["S(0)", "S(1)"]
    permuted = [n for n in autop.gm.graph.nodes if "index_select" in str(n.target)]
    assert {a.name for n in permuted for a in n.all_input_nodes} >= set(autop.step.input_nodes)


def test_auto_parallel_refuses_what_a_preset_would_override():
    from autoshard.planning.presets import check_auto_parallel_args

    check_auto_parallel_args("fsdp", [None, None], None)
    with pytest.raises(PresetError, match="pass plain tensors"):
        check_auto_parallel_args("fsdp", [None, ("S(0)",)], None)
    with pytest.raises(PresetError, match="leave parameter_memory_budget out"):
        check_auto_parallel_args("ddp", [None], (1.0, 1.0))
