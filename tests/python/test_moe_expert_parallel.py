"""Expert parallelism as a planner choice (issue 14, "MoE at scale"): a DeepSeek-style MoE
block in the grouped, capacity-based form (models_zoo.DeepSeekMoEBlock) is planned freely on
virtual (dp, ep) meshes (fake process group, H100 costs) at a realistic size. Expected: the
expert weights [E, D, H] are sharded on E over the ep dim (each rank keeps its experts' full
weights) and the tokens move between group-major [G, E, C, D] and expert-major [E, G, C, D]
layouts by all-to-all (a Shard -> Shard redistribution over one mesh dim), because that is
cheaper than gathering the expert weights: the same model with its experts pinned to run on
token-sharded inputs (weights gathered, FSDP-style) costs more. Runs on 4 gloo ranks:
test_moe_expert_parallel_dist.py."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from autoshard import _core

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)

EXPERT_WEIGHTS = ("w1", "w3", "w2")


def _kind(src: str, dst: str) -> str | None:
    """The collective one mesh dim needs to go from placement ``src`` to ``dst``."""
    if src == dst or dst.startswith("P") or src == "R":
        return None
    if src.startswith("P"):
        return "all_reduce" if dst == "R" else "reduce_scatter"
    return "all_gather" if dst == "R" else "all_to_all"


def planned_collectives(step, plan: dict) -> list[dict]:
    """Every node input whose planned layout differs from its producer's output layout, as
    (node, op, input, mesh dim, kind, src, dst, shape)."""
    from autoshard.program.interpreter import tensor_refs

    nodes = plan["nodes"]

    def produced(ref):
        k = 0
        if ref.op == "call_function" and ref.target is operator.getitem:
            ref, k = ref.args
        return nodes[ref.name]["outputs"][k]

    out = []
    for n in step.gm.graph.nodes:
        if n.op != "call_function" or "inputs" not in nodes.get(n.name, {}):
            continue
        for ref, want in zip(tensor_refs(n.args, n.kwargs), nodes[n.name]["inputs"]):
            if want is None:
                continue
            src = produced(ref)
            for d, (s, t) in enumerate(zip(src, want)):
                kind = _kind(s, t)
                if kind:
                    out.append(
                        {
                            "node": n.name,
                            "op": str(n.target),
                            "input": ref.name,
                            "mesh_dim": d,
                            "kind": kind,
                            "src": src,
                            "dst": want,
                            "shape": tuple(ref.meta["val"].shape),
                        }
                    )
    return out


def _plan(mesh_shape, model_kwargs, batch, seq, pin_token_sharded_experts=False):
    """Traces and plans the block on a virtual mesh; returns (step, plan, param layouts)."""
    from autoshard import AutoParallel
    from autoshard.trace.fake_pg import fake_world
    from autoshard._testing.models_zoo import DeepSeekMoEBlock

    with torch.device("meta"):
        model = DeepSeekMoEBlock(**model_kwargs)
    dim = model_kwargs["dim"]
    with fake_world(mesh_shape, ("dp", "ep")) as mesh:
        with AutoParallel(
            model,
            lambda: (torch.empty(batch, seq, dim), torch.empty(batch, seq, dim)),
            mesh,
            capture="direct",
            hardware="H100",
            time_limit_s=30.0,
            plan_cache=False,
        ) as autop:
            autop.add_input_constraints([(Shard(0), Replicate())] * 2)
            autop.add_parameter_memory_constraint()  # default: 1 / mesh size per rank
            step = autop.step
            if pin_token_sharded_experts:
                # the alternative to expert parallelism: expert matmuls on token-sharded
                # rows [E, G*C, H] (S(1) everywhere), so the expert weights are gathered
                w = {
                    ph
                    for ph, fqn in step.param_fqns.items()
                    if fqn.rsplit(".", 1)[-1] in ("w1", "w3")
                }
                for n in step.gm.graph.nodes:
                    if n.target is torch.ops.aten.bmm.default and n.args[1].name in w:
                        autop.add_node_constraint(n.name, [Shard(1), Shard(1)])
            result = autop.optimize_placement()
    plan = getattr(result, "plan", result)
    layouts = {fqn: plan["nodes"][ph]["outputs"][0] for ph, fqn in step.param_fqns.items()}
    return step, plan, layouts


# a realistic layer: DeepSeek-V2-Lite-like widths (fine-grained experts of width 1408,
# top-6 of 64), 4096 tokens per data-parallel rank in groups of one 512-token sequence
REALISTIC = {"dim": 2048, "hidden": 1408, "n_experts": 64, "top_k": 6, "shared_hidden": 2816}
CASES = {
    "2x2": ((2, 2), REALISTIC, 16, 512),
    "8x8": ((8, 8), REALISTIC, 64, 512),
}


@pytest.fixture(scope="module", params=list(CASES))
def planned(request):
    mesh, kwargs, batch, seq = CASES[request.param]
    step, plan, layouts = _plan(mesh, kwargs, batch, seq)
    return request.param, step, plan, layouts


def test_expert_weights_are_sharded_on_experts_over_the_ep_dim(planned):
    name, step, plan, layouts = planned
    print(f"\n== {name}\n{plan['report']}")
    for fqn, lay in layouts.items():
        if fqn.rsplit(".", 1)[-1] in EXPERT_WEIGHTS:
            assert lay[1] == "S(0)", f"{name}: {fqn} is {lay}, not sharded on E over ep"


def test_tokens_move_between_group_and_expert_major_by_all_to_all(planned):
    name, step, plan, layouts = planned
    colls = planned_collectives(step, plan)
    a2a = [c for c in colls if c["kind"] == "all_to_all"]
    # the expert-major [E, G, C, D] and group-major [G, E, C, D] token tensors: the
    # transposes between them (and the views next to them) exchange tokens over ep
    e, dim = REALISTIC["n_experts"], REALISTIC["dim"]
    token_a2a = [
        c
        for c in a2a
        if c["mesh_dim"] == 1
        and len(c["shape"]) >= 3
        and c["shape"][-1] == dim
        and e in c["shape"][:2]
    ]
    assert token_a2a, f"{name}: no all-to-all of tokens over ep: {a2a}\n{plan['report']}"
    # and never an all-gather of an expert weight over ep
    weights = {
        ph for ph, fqn in step.param_fqns.items() if fqn.rsplit(".", 1)[-1] in EXPERT_WEIGHTS
    }
    gathered = [c for c in colls if c["input"] in weights and c["mesh_dim"] == 1]
    assert not gathered, gathered


def test_expert_parallelism_is_cheaper_than_gathering_the_expert_weights():
    """The planner's choice is a real saving under its own cost model: pinning the expert
    matmuls to token-sharded rows (expert weights gathered before use, FSDP-style) gives a
    dearer plan."""
    mesh, kwargs, batch, seq = CASES["2x2"]
    _, free, _ = _plan(mesh, kwargs, batch, seq)
    _, gathered, layouts = _plan(mesh, kwargs, batch, seq, pin_token_sharded_experts=True)
    ep_us, fsdp_us = free["summary"]["total_us"], gathered["summary"]["total_us"]
    print(f"\nexpert parallel {ep_us:.0f} us, experts gathered {fsdp_us:.0f} us")
    assert ep_us < 0.9 * fsdp_us, (ep_us, fsdp_us)


# ----------------------------------------------------------------------------- the model


def test_capacity_dispatch_equals_dense_top_k_routing_when_nothing_is_dropped():
    """With room for every token, the grouped dispatch/combine einsums compute exactly the
    top-k mixture (renormalised weights) plus the shared expert; with less room the later
    assignments of a group are dropped, deterministically."""
    import torch.nn.functional as F

    from autoshard._testing.models_zoo import DeepSeekMoELayer

    torch.manual_seed(0)
    for score in ("softmax", "sigmoid"):
        layer = DeepSeekMoELayer(16, 8, 8, 2, 16, capacity_factor=8.0, score_func=score)
        x = torch.randn(4, 8, 16)
        y, _ = layer(x)
        h = layer.norm(x).reshape(-1, 16)
        logits = layer.router(h)
        scores = logits.softmax(-1) if score == "softmax" else logits.sigmoid()
        w, idx = scores.topk(2, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        ref = layer.shared_down(F.silu(layer.shared_gate(h)) * layer.shared_up(h))
        for t in range(h.shape[0]):
            for j in range(2):
                e = idx[t, j]
                ref[t] += w[t, j] * (
                    (F.silu(h[t] @ layer.w1[e]) * (h[t] @ layer.w3[e])) @ layer.w2[e]
                )
        torch.testing.assert_close(y, x + ref.reshape(x.shape), rtol=1e-5, atol=1e-5)
    tight = DeepSeekMoELayer(16, 8, 8, 2, 16, capacity_factor=0.5)
    tight.load_state_dict(layer.state_dict())
    assert tight.capacity(8) == 1
    y_tight, _ = tight(x)
    assert not torch.allclose(y_tight, y)  # some assignments dropped
    torch.testing.assert_close(tight(x)[0], y_tight, rtol=0, atol=0)


@pytest.mark.parametrize("mesh", [(2,), (2, 2)], ids=lambda m: "x".join(map(str, m)))
def test_every_rule_the_block_needs_validates(mesh):
    """The ops of the block's joint graph (einsum's bmm/permute/view, cumsum, topk, eq,
    arange, sigmoid/softmax, means) all have rules, and every strategy they offer matches
    the unsharded op (python/autoshard/testing/validate.py), softmax and sigmoid routers, with
    dropped tokens."""
    from autoshard._testing import validate as V

    report = V.validate_all(V.standard_captures(("deepseek_moe", "deepseek_moe_sigmoid")), [mesh])
    print("\n" + report.summary())
    assert not report.unsupported, report.unsupported
    assert not report.failures, report.summary()
    assert report.strategies_checked > 1000
