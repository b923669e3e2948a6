"""Mixed precision (FSDP2's MixedPrecisionPolicy): casts traced into the step, collectives
placed on the right side of them, and a one-rank step equal to eager bf16 numerics."""

import json

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import Shard

from autoshard import AutoParallel, _core
from autoshard.runtime.module_state import load_full_state_dict
from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.trace.fake_pg import fake_world
from autoshard.planning.graph_export import graph_json
from autoshard.trace.mixed_precision import CastingStep, canonical_policy
from autoshard.trace.tracer import trace_training_step

BF16_FP32 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


class Net(nn.Module):
    def __init__(self, d=64, h=256):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).float().pow(2).mean()


def _meta_net(d=64, h=256):
    with torch.device("meta"):
        return Net(d, h)


def _producer_layout(plan, step, node_name):
    node = next(n for n in step.gm.graph.nodes if n.name == node_name)
    src = node.all_input_nodes[0]
    return plan["nodes"][src.name]["outputs"][0]


def test_collectives_sit_on_the_policy_side_of_the_casts():
    with fake_world((4,), device_type="cpu") as mesh:
        # large enough that compute, not collective latency, decides: data parallel
        with AutoParallel(
            _meta_net(1024, 4096),
            lambda: torch.empty(16384, 1024),
            mesh,
            mp_policy=BF16_FP32,
            time_limit_s=5,
        ) as autop:
            autop.add_input_constraints([(Shard(0),)])
            plan = autop.optimize_placement()
            step = autop.step
    assert step.local_inputs, "the policy must mark the casts"
    casts = {
        n.name: n
        for n in step.gm.graph.nodes
        if n.op == "call_function" and n.target == torch.ops.aten._to_copy.default
    }
    down = [n for n in casts.values() if n.all_input_nodes[0].name in step.param_fqns]
    up = [
        n
        for n in casts.values()
        if n.meta["val"].dtype == torch.float32
        and n.all_input_nodes[0].meta["val"].dtype == torch.bfloat16
        and n.name in step.local_inputs
    ]
    assert len(down) == 4 and len(up) == 4  # two weights and two biases
    for name in step.local_inputs:
        # no collective on a marked edge: the input arrives in its producer's layout
        assert plan["nodes"][name]["inputs"][0] == _producer_layout(plan, step, name), name
    # FSDP-like default (1/4 of the parameters per rank): parameters sharded, gathered in bf16
    for n in down:
        assert plan["nodes"][n.name]["inputs"][0] == ["S(0)"]
    # data-parallel weight gradients leave the matmul Partial and are reduced after the cast
    assert any(plan["nodes"][n.name]["inputs"][0] == ["P(sum)"] for n in up)


def test_reduce_in_param_dtype_leaves_the_reduction_free():
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    step = trace_training_step(_meta_net(), lambda: torch.empty(32, 64), mp_policy=mp)
    marked = {n.name for n in step.gm.graph.nodes if n.name in step.local_inputs}
    # only the forward casts (and nothing on the gradient side) are marked
    assert marked and all(
        n.all_input_nodes[0].name in step.param_fqns
        for n in step.gm.graph.nodes
        if n.name in marked
    )
    assert all(e.get("local_inputs") in (None, [0]) for e in json.loads(graph_json(step))["nodes"])


def test_policy_is_canonicalised():
    mp = canonical_policy(MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    assert mp.reduce_dtype == torch.bfloat16 and mp.cast_forward_inputs
    assert canonical_policy(MixedPrecisionPolicy()) is None  # nothing to cast


def test_one_rank_step_matches_eager_bf16(mesh1):
    torch.manual_seed(0)
    ref = Net()
    step = trace_training_step(_meta_net(), lambda: torch.empty(16, 64), mp_policy=BF16_FP32)
    plan = json.loads(
        _core.plan_graph(
            graph_json(step),
            json.dumps({"mesh": {"shape": [1], "dim_names": ["dp"]}, "time_limit_s": 2}),
        )
    )
    par = build_parallel_module(_meta_net(), step, plan, mesh1, strict=True)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    x = torch.randn(16, 64)
    loss = par(x)
    eager = CastingStep(ref, canonical_policy(BF16_FP32))
    rloss = eager(x)
    # the matmuls run in bf16 (the trace splits addmm into mm + add, so roundings differ
    # from eager's fused addmm by bf16 epsilons)
    assert all(
        n.meta["val"].dtype == torch.bfloat16
        for n in step.gm.graph.nodes
        if n.op == "call_function" and n.target == torch.ops.aten.mm.default
    )
    torch.testing.assert_close(loss, rloss.detach(), rtol=1e-2, atol=1e-4)
    loss.backward()
    rloss.backward()
    for name, p in ref.named_parameters():
        got = dict(par.named_parameters())[name]
        assert got.dtype == torch.float32 and got.grad.dtype == torch.float32
        torch.testing.assert_close(got.grad.full_tensor(), p.grad, rtol=2e-2, atol=2e-4)
