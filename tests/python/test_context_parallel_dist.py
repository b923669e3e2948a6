"""Context parallelism on 4 gloo ranks: a Llama-style model with causal SDPA, and with
FlexAttention (a causal document mask, a BlockMask input), its tokens' sequence dim sharded
over a ``cp`` mesh dim (cp=4, and dp=2 x cp=2), the attention calls in the sequence row (q, out, logsumexp split over the sequence, k and v all-gathered; grad_k /
grad_v Partial, reduced back), 3 SGD steps equal to the single-process model (rtol 1e-5),
with the sequence in load-balanced head-tail order (trace/load_balance.py, on by default on a
``cp`` dim): every rank's attention calls allow the same number of causal (query, key) pairs
(within 10 %), counted from the masks the local calls receive (FlexAttention: the pairs its mask allows at
the rank's positions). A document mask is balanced by the trainer's per-document order
(load_balance.document_head_tail_order with the contiguous split), not by the head-tail order
of the whole sequence, whose figures are printed.
Workers: tests/python/dist/context_parallel_worker.py; the causal mask's per-rank offset:
python/autoshard/ops/context_parallel.py."""

from __future__ import annotations

import pytest

from conftest import by_name, run_torchrun, trained_like_reference

SEQ = 256
PER_DOCUMENT = {"per_document": True, "options": {"cp_load_balance": False}}
SCENARIOS = [
    {"name": "cp4", "mesh": [4], "dims": ["cp"], "batch": 1, "seq": SEQ},
    {"name": "dp2_cp2", "mesh": [2, 2], "dims": ["dp", "cp"], "batch": 2, "seq": SEQ},
    # the contiguous split (the causal mask offset per rank, ops/context_parallel.py)
    {
        "name": "cp4_contiguous",
        "mesh": [4],
        "dims": ["cp"],
        "batch": 1,
        "seq": SEQ,
        "options": {"cp_load_balance": False},
    },
    # FlexAttention: the mods called at each rank's positions (ops/context_parallel.py), a
    # causal mask and a causal document mask (documents of 96, 64 and 96 tokens) in the
    # head-tail order of the whole sequence, and the document mask with the trainer's
    # per-document order (load_balance.document_head_tail_order; the contiguous split)
    *(
        {"name": f"flex_{name}", "mesh": mesh, "dims": dims, "batch": batch, "seq": SEQ}
        | {"attention": "flex", "documents": documents, **per_document}
        for name, mesh, dims, batch, documents, per_document in (
            ("cp4_causal", [4], ["cp"], 1, [], {}),
            ("cp4_documents", [4], ["cp"], 1, [96, 64, 96], {}),
            ("cp4_per_document", [4], ["cp"], 1, [96, 64, 96], PER_DOCUMENT),
            ("dp2_cp2_per_document", [2, 2], ["dp", "cp"], 2, [96, 64, 96], PER_DOCUMENT),
        )
    ),
]
# every rank's causal work within 10 %: the head-tail order of the whole sequence balances a
# causal mask, the per-document order a document mask
BALANCED = [
    s["name"]
    for s in SCENARIOS
    if s.get("per_document")
    or (s.get("options", {}).get("cp_load_balance", True) and not s.get("documents"))
]
DOCUMENTS = [s["name"] for s in SCENARIOS if s.get("documents") and not s.get("per_document")]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_torchrun(
        "context_parallel_worker.py", SCENARIOS, tmp_path_factory.mktemp("cp"), timeout=600
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_sequence_sharded_attention_trains_like_single_process(results, name):
    r0 = trained_like_reference(results, name)[0]
    print(f"\n{name}: plan {r0['plan_seconds']:.1f} s, collectives {r0['collectives']}")
    for node, e in r0["attention"].items():
        print(f"  {node}: inputs {e['inputs']} outputs {e['outputs']}")
    print(f"  collectives by node: {r0['collectives_by_node']}")
    cp = len(r0["attention"][next(iter(r0["attention"]))]["inputs"][0]) - 1  # the last mesh dim
    flex = name.startswith("flex")
    for node, e in r0["attention"].items():
        backward = node.endswith("backward") or "_backward_" in node
        q_at = 1 if backward and not flex else 0  # SDPA's backward takes grad_out first
        q, k = e["inputs"][q_at], e["inputs"][q_at + 1]
        assert q[cp] == "S(2)" and k[cp] == "R", (node, e)  # queries split, keys gathered
        if backward:
            assert e["outputs"][1][cp] == e["outputs"][2][cp] == "P(sum)", (node, e)
    # no gather of q (nor, in the backward, of grad_out) before attention: on every mesh dim
    # they leave their producers in the layout the attention row reads, or replicated (a
    # local slice)
    for node, e in r0["attention"].items():
        backward = "backward" in node and not flex
        wanted = e["inputs"][:2] if backward else e["inputs"][:1]
        for got, want in zip(e["q_producers"], wanted):
            assert all(g in (w, "R") for g, w in zip(got, want)), (node, e)


@pytest.mark.slow
@pytest.mark.parametrize("name", BALANCED)
def test_causal_work_is_balanced_over_the_ranks(results, name):
    pairs = [by_name(res)[name]["attention_pairs"] for res in results]
    print(f"\n{name}: allowed (query, key) pairs per rank {pairs}")
    assert min(pairs) > 0, pairs
    assert max(pairs) / min(pairs) <= 1.1, pairs


@pytest.mark.slow
def test_the_contiguous_split_is_uneven(results):
    """Without the load balancer rank r's queries see (2r+1)/n^2 of the causal pairs: the
    last of 4 ranks does 1.75x the even share (what the head-tail order removes)."""
    pairs = [by_name(res)["cp4_contiguous"]["attention_pairs"] for res in results]
    even = sum(pairs) / len(pairs)
    print(f"\ncp4_contiguous: allowed (query, key) pairs per rank {pairs}")
    assert pairs == sorted(pairs) and pairs[-1] / even == pytest.approx(1.75, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("name", DOCUMENTS)
def test_document_mask_work_per_rank_is_reported(results, name):
    """A document mask's causal pairs per rank under the head-tail order of the whole
    sequence: balanced only as far as the documents allow (the per-document order balances
    them, test_causal_work_is_balanced_over_the_ranks); printed, and never more uneven than
    the contiguous split's 1.75x of a causal mask."""
    pairs = [by_name(res)[name]["attention_pairs"] for res in results]
    print(f"\n{name}: allowed (query, key) pairs per rank {pairs}")
    assert min(pairs) > 0 and max(pairs) / (sum(pairs) / len(pairs)) < 1.75, pairs
