"""CUDA attention kernels on this CPU-only build (issue 40, item 7).

A GPU trace calls ``_scaled_dot_product_{flash,efficient,cudnn}_attention`` where a CPU trace
calls ``_scaled_dot_product_flash_attention_for_cpu``. Checked here without a GPU:
- every attention kernel runs on local shards in the plan's rows (ops/local_run.py), not
  through DTensor's strategies;
- a plan made on a CPU host (``_for_cpu`` nodes) applies to a graph whose attention is the
  efficient kernel (built here by rewriting a CPU trace's attention nodes; the efficient
  kernel's meta function shapes it, so the program lowers on fake tensors): its nodes take
  the plan's layouts by role and run locally;
- the layouts carried over follow the C++ rule (a broadcast bias stays replicated).
What only a GPU proves: that the CUDA kernels return the values on local shards
(scripts/gpu_check.sh)."""

import json
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoshard import _core
from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.ops.attention_kernels import (
    KERNELS,
    entry_for_row,
    kernel_of,
    match_attention_kernels,
)
from autoshard.trace.fake_pg import fake_world
from autoshard.planning.graph_export import graph_json
from autoshard.ops.local_run import LOCAL_OPS, runs_locally
from autoshard.trace.tracer import trace_training_step
from autoshard.runtime.module_runtime import runtime_of

aten = torch.ops.aten
needs_planner = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

BATCH, HEADS = 64, 4  # large enough that the planner splits the attention on 4 ranks
EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
EFFICIENT_BWD = "aten._scaled_dot_product_efficient_attention_backward.default"


class Attn(nn.Module):
    def __init__(self, dim=64, heads=HEADS):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, d)).pow(2).mean()


def _trace():
    with torch.device("meta"):
        model = Attn()
    return model, trace_training_step(model, lambda: torch.empty(BATCH, 32, 64), capture="direct")


def _fake_val(step, node):
    """``node``'s output on the step's fake tensors (the op's meta function)."""
    if node.target is operator.getitem:
        return node.args[0].meta["val"][node.args[1]]
    args = torch.fx.node.map_arg(node.args, lambda a: a.meta["val"])
    with step.fake_mode:
        return node.target(*args)


def _as_efficient_kernel(step, log_sumexp=True):
    """The CPU trace's flash-for-CPU forward and backward nodes replaced by the efficient
    kernel's, as a GPU trace of fp32 attention has them (with the philox seed and offset
    the forward returns passed to the backward). ``log_sumexp=False``: the forward returns
    an empty logsumexp, as it does when no input needs a gradient."""
    g = step.gm.graph
    cpu_fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
    cpu_bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    fwd = next(n for n in g.nodes if n.target is cpu_fwd)
    bwd = next(n for n in g.nodes if n.target is cpu_bwd)
    q, k, v, dropout_p, is_causal = fwd.args
    with g.inserting_after(fwd):  # named as a trace names them (no "_default")
        new_fwd = g.create_node(
            "call_function",
            aten._scaled_dot_product_efficient_attention.default,
            (q, k, v, None, log_sumexp, dropout_p, is_causal),
            name="_scaled_dot_product_efficient_attention",
        )
    with g.inserting_after(new_fwd):
        seed = g.call_function(operator.getitem, (new_fwd, 2))
    with g.inserting_after(seed):
        offset = g.call_function(operator.getitem, (new_fwd, 3))
    grad_out, q, k, v, out, lse, dropout_p, is_causal = bwd.args
    grad_mask = [True, True, True, False]  # q, k, v; no bias
    with g.inserting_after(bwd):
        new_bwd = g.create_node(
            "call_function",
            aten._scaled_dot_product_efficient_attention_backward.default,
            (grad_out, q, k, v, None, out, lse, seed, offset, dropout_p, grad_mask, is_causal),
            name="_scaled_dot_product_efficient_attention_backward",
        )
    for old, new in ((fwd, new_fwd), (bwd, new_bwd)):
        for user in list(old.users):
            user.args = (new, user.args[1])
        g.erase_node(old)
    for n in g.nodes:  # the logsumexp is padded to 32 rows: its getitem's value changes too
        if n in (new_fwd, seed, offset, new_bwd) or (
            n.target is operator.getitem and n.args[0] in (new_fwd, new_bwd)
        ):
            n.meta["val"] = _fake_val(step, n)
    step.gm.recompile()
    return new_fwd.name, new_bwd.name


def test_every_attention_kernel_runs_on_local_shards():
    """DTensor 2.13 has strategies for the CUDA kernels, but not the C++ rule's (a
    broadcast bias, an empty logsumexp): all of them run locally, in the plan's rows."""
    assert {f"aten.{k}.default" for k in KERNELS} <= LOCAL_OPS

    class _Node:
        op = "call_function"

        def __init__(self, target):
            self.target = target

    for name in KERNELS:
        node = _Node(getattr(aten, name).default)
        assert runs_locally(node), name
        assert kernel_of(node) == name


@needs_planner
@pytest.mark.parametrize(
    "row, log_sumexp",
    [(["S(0)"], True), (["S(1)"], True), (["S(0)"], False)],
    ids=["batch", "heads", "batch-no-logsumexp"],
)
def test_cpu_plan_applies_to_the_efficient_kernel_by_role(row, log_sumexp):
    """(Without the logsumexp, DTensor's strategy would return the empty [B, H, 0] tensor
    replicated where the plan shards it: a PlanMismatchError under strict=True.)"""
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        _, cpu_step = _trace()
        options = {
            "mesh": {"shape": [4], "dim_names": ["dp"]},
            "time_limit_s": 2,
            # the attention split on the batch or the heads (the planner's choice for so
            # small a model is to replicate it)
            "node_constraints": {"_scaled_dot_product_flash_attention_for_cpu": row},
        }
        plan = json.loads(_core.plan_graph(graph_json(cpu_step), json.dumps(options)))
        src = plan["nodes"]["_scaled_dot_product_flash_attention_for_cpu"]
        src_bwd = plan["nodes"]["_scaled_dot_product_flash_attention_for_cpu_backward"]
        assert src["inputs"][0] == row

        model, gpu_step = _trace()
        fwd_name, bwd_name = _as_efficient_kernel(gpu_step, log_sumexp)
        assert fwd_name == "_scaled_dot_product_efficient_attention"
        assert fwd_name not in plan["nodes"] and bwd_name not in plan["nodes"]
        par = build_parallel_module(model, gpu_step, plan, mesh, strict=True)
        runner = runtime_of(par).runner

        # the plan's layouts, carried over by role: q, k, v and out, logsumexp in the row;
        # the 0-d philox seed and offset replicated
        fwd = runner.plan_nodes[fwd_name]
        assert fwd["inputs"] == [row, row, row]
        assert fwd["outputs"] == [row, row, ["R"], ["R"]]
        assert src["outputs"] == [row, row]
        bwd = runner.plan_nodes[bwd_name]
        # grad_out, q, k, v, out, logsumexp in the row, seed and offset replicated
        assert bwd["inputs"] == [row] * 6 + [["R"], ["R"]]
        assert bwd["outputs"][:3] == src_bwd["outputs"] == [row] * 3

        # lowered (fake tensors): both kernels ran on local shards, in the carried layouts
        fwd_gm = par.parallel_gm
        assert runner.warnings[f"local:{EFFICIENT}"] >= 1
        assert runner.warnings[f"local:{EFFICIENT_BWD}"] >= 1
        assert runner.recorded[fwd_name]["inputs"] == [row] * 3
        assert runner.recorded[fwd_name]["outputs"] == [row, row, ["R"], ["R"]]
        efficient = aten._scaled_dot_product_efficient_attention.default
        calls = [n for n in fwd_gm.graph.nodes if n.target is efficient]
        assert len(calls) == 1
        q_local = calls[0].args[0].meta["val"].shape
        split = int(row[0][2])
        assert q_local[split] == (BATCH if split == 0 else HEADS) // 4


def _node(name, target, args, val, kwargs=None):
    """A stand-alone FX node with a value, as the trace gives one."""
    g = torch.fx.Graph()
    placeholders = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            p = g.placeholder(f"a{i}")
            p.meta["val"] = a
            placeholders.append(p)
        else:
            placeholders.append(a)
    n = g.call_function(target, tuple(placeholders), kwargs or {})
    n.meta["val"] = val
    return n


def test_carried_bias_layout_follows_the_rule():
    """An expanded [B, H, S, S] bias (what SDPA hands the CUDA kernel) follows the row; a
    bias broadcast over the row's dim stays replicated; a backward that owes that bias a
    gradient has no such row."""
    with torch.device("meta"):
        q = torch.empty(2, 4, 16, 8)
        lse = torch.empty(2, 4, 32)
        seed = torch.empty((), dtype=torch.int64)
        outs = (q, lse, seed, seed)
        efficient = aten._scaled_dot_product_efficient_attention.default
        for bias, batch, heads in (
            (torch.empty(2, 4, 16, 16), ["S(0)"], ["S(1)"]),
            (torch.empty(1, 4, 16, 16), ["R"], ["S(1)"]),
            (torch.empty(2, 1, 16, 16), ["S(0)"], ["R"]),
        ):
            node = _node("e", efficient, (q, q, q, bias, True), outs)
            assert entry_for_row(node, ["S(0)"])["inputs"][3] == batch
            assert entry_for_row(node, ["S(1)"])["inputs"][3] == heads
            assert entry_for_row(node, ["S(1)"])["outputs"] == [["S(1)"], ["S(1)"], ["R"], ["R"]]
        bias = torch.empty(1, 4, 16, 16)
        bwd = _node(
            "b",
            aten._scaled_dot_product_efficient_attention_backward.default,
            (q, q, q, q, bias, q, lse, seed, seed, 0.0, [True] * 4, False),
            (q, q, q, bias),
        )
        assert entry_for_row(bwd, ["S(0)"]) is None  # the bias gradient would be a sum
        heads = entry_for_row(bwd, ["S(1)"])
        assert heads["outputs"] == [["S(1)"]] * 4
        assert heads["inputs"][4] == ["S(1)"]


def test_plans_that_name_the_graphs_kernels_are_left_alone():
    _, step = _trace()
    plan = {"nodes": {n.name: {} for n in step.gm.graph.nodes}}
    assert match_attention_kernels(plan, step.gm) is plan


def test_unpaired_kernels_are_left_to_dtensor(caplog):
    """Two plan nodes for one graph node: no pairing is safe, nothing is carried over."""
    _, step = _trace()
    _as_efficient_kernel(step)
    plan = {
        "nodes": {
            "_scaled_dot_product_flash_attention_for_cpu": {"inputs": [["S(0)"]] * 3},
            "_scaled_dot_product_flash_attention_for_cpu_1": {"inputs": [["S(0)"]] * 3},
        }
    }
    with caplog.at_level("WARNING", logger="autoshard.ops.attention_kernels"):
        out = match_attention_kernels(plan, step.gm)
    assert "_scaled_dot_product_efficient_attention" not in out["nodes"]
    assert "left to DTensor" in caplog.text


class MaskedAttn(nn.Module):
    """Attention with an explicit additive mask that broadcasts over the heads (a padding
    mask, [B, 1, S, S]) or over batch and heads (a causal mask, [1, 1, S, S])."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.heads = heads

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).pow(2).mean()


@needs_planner
@pytest.mark.parametrize("mask_batch", [1, 4], ids=["causal-1x1", "padding-Bx1"])
def test_masked_cpu_attention_backward_keeps_its_rows_and_they_are_exact(mask_batch):
    """The CPU flash backward returns no gradient for its mask, so a mask broadcast over the
    heads (or the batch) does not take the head (batch) row away from it: every rank reads
    the whole mask. Each strategy is run rank by rank and compared with the unsharded op."""
    from autoshard._testing import validate as V

    torch.manual_seed(0)
    s = 6
    causal = torch.full((s, s), float("-inf")).triu(1)
    mask = (causal + torch.randn(mask_batch, 1, s, s)).expand(mask_batch, 1, s, s).contiguous()
    captured = V.capture_model("masked", MaskedAttn(), (torch.randn(4, s, 16), mask))
    backward = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
    node = next(n for n in captured.graph["nodes"] if n["op"] == backward)
    strategies = V.enumerate_strategies(captured.graph, [2])["nodes"][node["name"]]
    q_layouts = {tuple(st["inputs"][1]) for st in strategies}
    assert ("S(1)",) in q_layouts  # the head row, the mask replicated
    if mask_batch == 1:
        assert ("S(0)",) in q_layouts  # the batch row too: the mask serves every batch
    for mesh in ([2], [2, 2]):
        report = V.validate(captured, mesh, ops={backward, backward.replace("_backward", "")})
        assert report.strategies_checked > 0 and not report.failures, report.summary()
