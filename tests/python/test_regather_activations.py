"""Reshard recomputation of gathered activations (cpp/src/planner/recompute.cpp,
``regathered_activations``): under context parallelism attention's keys and values are
gathered to the whole sequence, and the ops after the gather (GQA's repeat, the transpose
into the kernel's layout) make whole-sequence copies that the attention backward reads.
With ``recompute="reshard"`` the plan recomputes those ops, so the backward keeps each rank's
shard and gathers it again, as FSDP gathers a weight again; with ``"none"`` the
whole-sequence copies are kept. Planned on a fake 4-rank ``cp`` mesh: no step runs here
(bench/long_context.py runs such a plan on 4 gloo ranks: same loss and gradients as without
recomputation, 24 % less peak memory)."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard

from autoshard import AutoParallel
from autoshard.models import Llama, LlamaConfig
from autoshard.trace.fake_pg import fake_mesh

SEQ = 1024
CFG = LlamaConfig(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_dim=256, max_seq_len=SEQ,
    attention="sdpa",
)  # fmt: skip


def _sequence_split(autop) -> None:
    """Attention in its sequence row, the residual stream sequence-sharded (as
    bench/long_context.py pins them) and every forward projection too: the keys and values
    are then gathered after their projections, wherever the cost model would gather them."""
    phase = autop.step.schedule.phase
    for n in autop.gm.graph.nodes:
        shape = tuple(getattr(n.meta.get("val"), "shape", ()))
        if "scaled_dot_product" in str(n.target):
            autop.add_node_constraint(n.name, (Shard(2),))
        elif str(n.target) in ("aten.embedding.default", "aten.add.Tensor") and shape == (
            1, SEQ, CFG.dim,
        ):  # fmt: skip
            autop.add_node_constraint(n.name, (Shard(1),))
        elif str(n.target) == "aten.mm.default" and phase[n.name] == "forward" and shape[0] == SEQ:
            autop.add_node_constraint(n.name, (Shard(0),))


def _plan(recompute: str, memory_limit_bytes: int | None = None):
    """The traced step and its plan on a fake cp=4 CPU mesh."""
    mesh = fake_mesh((4,), ("cp",), device_type="cpu")
    try:
        with torch.device("meta"):
            model = Llama(CFG)
        inputs = lambda: tuple(torch.zeros(1, SEQ, dtype=torch.long) for _ in range(2))
        with AutoParallel(
            model,
            inputs,
            mesh,
            hardware="CPU",
            optimizer="sgd",
            recompute=recompute,
            memory_limit_bytes=memory_limit_bytes,
        ) as autop:
            autop.add_input_constraints([(Shard(1),), (Shard(1),)])
            _sequence_split(autop)
            plan = autop.optimize_placement().plan
            return autop.step, plan
    finally:
        dist.destroy_process_group()


def _schedule(step, plan):
    return step.schedule.with_recompute(step.gm, plan.get("recompute", ()))


def _whole_sequence(plan, node) -> bool:
    """Whether some output of ``node`` has a sequence dim the plan does not shard: every rank
    holds the whole sequence of it."""
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else [vals]
    outputs = (plan["nodes"].get(node.name) or {}).get("outputs") or []
    for val, layout in zip(vals, outputs):
        if isinstance(val, torch.Tensor) and layout is not None:
            sharded = {int(p[2:-1]) % val.dim() for p in layout if p.startswith("S(")}
            if any(size == SEQ and d not in sharded for d, size in enumerate(val.shape)):
                return True
    return False


def _kept_sources(step, plan, name: str) -> list:
    """The values the backward rebuilds ``name`` from: ``name`` itself where it is kept,
    else the kept values its recomputed producers read."""
    schedule, nodes = _schedule(step, plan), {n.name: n for n in step.gm.graph.nodes}
    found, todo, seen = [], [nodes[name]], set()
    while todo:
        n = todo.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        if n.name in schedule.recompute:
            todo.extend(n.all_input_nodes)
        elif n.name in schedule.saved:
            found.append(n)
    return found


def _attention_keys_and_values(step) -> list[str]:
    return [
        ref.name
        for n in step.gm.graph.nodes
        if n.op == "call_function" and str(n.target).startswith("aten._scaled_dot_product")
        and "backward" not in str(n.target)
        for ref in n.args[1:3]
    ]  # fmt: skip


@pytest.fixture(scope="module")
def plans():
    return {mode: _plan(mode) for mode in ("none", "reshard")}


def test_without_reshard_the_gathered_keys_and_values_are_kept(plans):
    step, plan = plans["none"]
    kv = _attention_keys_and_values(step)
    assert len(kv) == 2 * CFG.n_layers
    for name in kv:
        (kept,) = _kept_sources(step, plan, name)
        assert kept.name == name and _whole_sequence(plan, kept)


def test_reshard_keeps_shards_and_gathers_the_keys_and_values_again(plans):
    step, plan = plans["reshard"]
    for name in _attention_keys_and_values(step):
        assert name in plan["recompute"]
        sources = _kept_sources(step, plan, name)
        assert sources, name
        assert not [n.name for n in sources if _whole_sequence(plan, n)], name
    # the planner's own count of the bytes kept between the passes falls with them
    kept = {m: p["summary"]["memory"]["saved_activations"] for m, (_, p) in plans.items()}
    assert kept["reshard"] < kept["none"]


def test_a_memory_limit_gets_it_from_the_default_mode(plans):
    """recompute="auto" under a limit only the reshard plan fits raises blocks to reshard,
    which now gathers keys and values again too."""
    peak = {m: p["summary"]["memory"]["peak_bytes"] for m, (_, p) in plans.items()}
    assert peak["reshard"] < peak["none"]
    step, plan = _plan("auto", memory_limit_bytes=peak["reshard"])
    assert plan["summary"]["recompute"]["fits"]
    assert set(plan["summary"]["recompute"]["blocks"].values()) == {"reshard"}
    assert set(_attention_keys_and_values(step)) & set(plan["recompute"])
