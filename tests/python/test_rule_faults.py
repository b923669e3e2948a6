"""Planted faults: the rule validator (python/autoshard/testing/validate.py) must catch known
DTensor-style rule bugs, and the real rules must not contain them.

A fault is planted with ``validate(..., extra_strategies=hook)``: the hook adds strategies to
a node's list as if a rule offered them, and the validator simulates them like the rules' own.
"""

from __future__ import annotations

import pytest
import torch

from autoshard._testing import validate as V


def plant(node_name: str, *strategies: tuple[list, list]):
    """A hook adding (input layouts, output layouts) strategies to the node ``node_name``."""

    def hook(node, offered):
        if node["name"] != node_name:
            return []
        return [{"inputs": list(i), "outputs": list(o)} for i, o in strategies]

    return hook


def node_named(cap: V.CapturedGraph, op: str, dtype: str | None = None) -> str:
    """The single node of ``op`` (with output dtype ``dtype``) in the captured graph."""
    found = [
        n["name"]
        for n in cap.graph["nodes"]
        if n["op"] == op and (dtype is None or n["outputs"][0]["dtype"] == dtype)
    ]
    assert len(found) == 1, (op, dtype, found)
    return found[0]


def offered(cap: V.CapturedGraph, node: str, mesh) -> set[str]:
    return {V.strategy_str(s) for s in V.enumerate_strategies(cap.graph, mesh)["nodes"][node]}


def output_kinds(cap: V.CapturedGraph, node: str, mesh) -> set[str]:
    kinds = set()
    for s in V.enumerate_strategies(cap.graph, mesh)["nodes"][node]:
        for layout in s["outputs"]:
            kinds |= set(layout or [])
    return kinds


def failed(report: V.ValidationReport, node: str) -> set[str]:
    return set(report.failed_strategies(node))


# ----------------------------------------------------------------------------- (i) casts


@pytest.fixture(scope="module")
def casts():
    def f(x):
        r = torch.relu(x)  # exact zeros: a sum split of 0 has non-zero terms
        return r.to(torch.int32), r.to(torch.bool), x.to(torch.float64), x.to(torch.float16)

    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(0)) * 4
    return V.capture_function("casts", f, x)


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_partial_sum_kept_through_integer_or_bool_cast_fails(casts, dtype):
    node = node_named(casts, "aten._to_copy.default", dtype)
    for mesh in [(2,), (2, 2)]:
        # the real rules never keep a sum/avg Partial through such a cast
        assert not output_kinds(casts, node, mesh) & {"P(sum)", "P(avg)"}
    planted = plant(node, ([["P(sum)"]], [["P(sum)"]]), ([["P(avg)"]], [["P(avg)"]]))
    report = V.validate(casts, (2,), extra_strategies=planted)
    print(report.summary())
    assert failed(report, node) == {"P(sum) -> P(sum)", "P(avg) -> P(avg)"}
    assert set(r.node for r in report.failures) == {node}  # nothing else fails
    assert all("differs from the unsharded op" in f.message for f in report.failures)


def test_float_to_float_casts_keep_partial_sum_and_validate(casts):
    for dtype in ["float64", "float16"]:
        node = node_named(casts, "aten._to_copy.default", dtype)
        assert {"P(sum) -> P(sum)", "P(avg) -> P(avg)"} <= offered(casts, node, (2,))
        assert "P(sum)S(0) -> P(sum)S(0)" in offered(casts, node, (2, 2))
    for mesh in [(2,), (4,), (2, 2)]:
        report = V.validate(casts, mesh)
        assert report.ok(), report.summary()
        assert (
            casts.name,
            mesh,
            node_named(casts, "aten._to_copy.default", "float64"),
            V.strategy_str(
                {"inputs": [["P(sum)"] * len(mesh)], "outputs": [["P(sum)"] * len(mesh)]}
            ),
        ) in report.passed


def test_partial_max_min_survive_a_monotone_cast(casts):
    node = node_named(casts, "aten._to_copy.default", "int32")  # float -> int truncates: monotone
    assert {"P(max) -> P(max)", "P(min) -> P(min)"} <= offered(casts, node, (2,))
    report = V.validate(casts, (4,))
    assert report.ok(), report.summary()
    assert (casts.name, (4,), node, "P(max) -> P(max)") in report.passed


# ----------------------------------------------------------------------------- (ii) new_*


@pytest.fixture(scope="module")
def factories():
    def f(x):
        return (
            x.new_zeros(x.shape),
            x.new_ones(x.shape),
            x.new_full(x.shape, 3.0),
            x.new_empty(x.shape),
            x.new_empty_strided(x.shape, x.stride()),
        )

    return V.capture_function("new_factories", f, torch.randn(8, 6))


@pytest.mark.parametrize("op", ["aten.new_empty.default", "aten.new_empty_strided.default"])
def test_new_empty_inheriting_partial_is_fine(factories, op):
    node = node_named(factories, op)
    assert {"P(sum) -> P(sum)", "P(max) -> P(max)"} <= offered(factories, node, (2,))
    report = V.validate(factories, (2, 2), ops={op})
    assert report.ok(), report.summary()
    assert (factories.name, (2, 2), node, "P(sum)P(sum) -> P(sum)P(sum)") in report.passed


@pytest.mark.parametrize("op", ["aten.new_ones.default", "aten.new_full.default"])
def test_new_ones_or_full_inheriting_partial_sum_fails(factories, op):
    node = node_named(factories, op)
    report = V.validate(
        factories, (2,), ops={op}, extra_strategies=plant(node, ([["P(sum)"]], [["P(sum)"]]))
    )
    assert failed(report, node) == {"P(sum) -> P(sum)"}, report.summary()
    report = V.validate(
        factories,
        (2, 2),
        ops={op},
        extra_strategies=plant(node, ([["R", "P(sum)"]], [["R", "P(sum)"]])),
    )
    assert failed(report, node) == {"RP(sum) -> RP(sum)"}, report.summary()
    assert all("differs from the unsharded op" in f.message for f in report.failures)


@pytest.mark.parametrize(
    "op", ["aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default"]
)
def test_rules_never_give_new_constants_a_partial_output(factories, op):
    node = node_named(factories, op)
    for mesh in [(2,), (2, 2)]:
        assert not any(k.startswith("P") for k in output_kinds(factories, node, mesh))
        # a Partial input still works: the constant comes out replicated
        assert "P(sum) -> R" in offered(factories, node, (2,))
    report = V.validate(factories, (2, 2), ops={op})
    assert report.ok(), report.summary()


def test_new_zeros_partial_sum_is_numerically_exact(factories):
    # documents the boundary of the check: a sum (avg, max, min) of zero terms IS zero, so a
    # Partial new_zeros cannot be told apart numerically; the rules still do not offer it
    node = node_named(factories, "aten.new_zeros.default")
    planted = plant(node, ([["P(sum)"]], [["P(sum)"]]), ([["P(max)"]], [["P(max)"]]))
    report = V.validate(factories, (2,), ops={"aten.new_zeros.default"}, extra_strategies=planted)
    assert report.ok(), report.summary()


# ----------------------------------------------------------------------------- (iii) uneven


@pytest.fixture(scope="module")
def uneven():
    def f(x, y):
        a = torch.relu(x) * y + 1.0
        return a.to(torch.bfloat16), torch.exp(a), a.neg()

    gen = torch.Generator().manual_seed(3)
    return V.capture_function(
        "uneven", f, torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen)
    )


@pytest.mark.parametrize("mesh", [(4,), (2, 2)], ids=["4", "2x2"])
def test_uneven_shard_is_kept_through_pointwise_and_dtype_ops(uneven, mesh):
    shard = ["S(0)"] * len(mesh)  # dim 0 has 3 rows: 4 shards of sizes 1, 1, 1, 0
    for n in uneven.graph["nodes"]:
        if n["op"] == "placeholder":
            continue
        n_in = sum(1 for a in n["args"] if isinstance(a, dict) and "ref" in a)
        want = V.strategy_str({"inputs": [shard] * n_in, "outputs": [shard]})
        assert want in offered(uneven, n["name"], mesh), (
            f"{n['op']} ({n['name']}) on mesh {list(mesh)}: an input sharded unevenly "
            f"(3 rows over 4 ranks) must keep its sharding ({want}), not be forced to Replicate"
        )
    report = V.validate(uneven, mesh)
    assert report.ok(), report.summary()
    assert sum(1 for k in report.passed if "".join(shard) in k[3]) >= 5


def test_uneven_shards_validate_even_when_planted(uneven):
    # independent of what the rules offer: the simulation of empty trailing shards is right
    def hook(node, offered_):
        n_in = sum(1 for a in node["args"] if isinstance(a, dict) and "ref" in a)
        return [{"inputs": [["S(0)"]] * n_in, "outputs": [["S(0)"]]}]

    report = V.validate(uneven, (4,), extra_strategies=hook)
    assert report.ok(), report.summary()


# ----------------------------------------------------------------------------- the validator bites


@pytest.fixture(scope="module")
def mixed():
    def f(a, b, c):
        m = a @ b  # [6, 5]
        s = torch.softmax(m, dim=1)
        r = m.sum(dim=1)
        v = m.view(30)
        return torch.exp(m), s, r, v, m + c

    gen = torch.Generator().manual_seed(4)
    return V.capture_function(
        "mixed",
        f,
        torch.randn(6, 4, generator=gen),
        torch.randn(4, 5, generator=gen),
        torch.randn(6, 5, generator=gen),
    )


@pytest.mark.parametrize(
    "op,inputs,outputs",
    [
        ("aten.mm.default", [["P(sum)"], ["P(sum)"]], [["P(sum)"]]),  # product of two sums
        ("aten.mm.default", [["S(0)"], ["R"]], [["R"]]),  # ranks hold different rows
        ("aten.mm.default", [["S(1)"], ["R"]], [["S(1)"]]),  # contraction dim sharded
        ("aten._softmax.default", [["S(1)"]], [["S(1)"]]),  # normalised over a shard
        ("aten.sum.dim_IntList", [["S(1)"]], [["S(0)"]]),  # reduced dim is a sum
        ("aten.view.default", [["S(1)"]], [["S(0)"]]),  # column shard != row block
        ("aten.exp.default", [["P(sum)"]], [["P(sum)"]]),  # non-linear of a sum
        ("aten.add.Tensor", [["P(sum)"], ["R"]], [["P(sum)"]]),  # R added on every rank
    ],
)
def test_known_wrong_rules_fail(mixed, op, inputs, outputs):
    node = node_named(mixed, op)
    planted = plant(node, (inputs, outputs))
    report = V.validate(mixed, (2,), ops={op}, extra_strategies=planted)
    wrong = V.strategy_str({"inputs": inputs, "outputs": outputs})
    assert wrong not in offered(mixed, node, (2,))
    assert failed(report, node) == {wrong}, report.summary()
    assert len(report.failures) == 1 and report.failures[0].max_error > 0


def test_rules_of_the_mixed_graph_validate(mixed):
    for mesh in [(2,), (3,), (4,), (2, 2)]:
        report = V.validate(mixed, mesh)
        assert report.ok(), report.summary()


# ----------------------------------------------------------------------------- (vi) issue 14


@pytest.fixture(scope="module")
def cases():
    pytest.importorskip("transformers")  # the grouped_mm case runs transformers' custom op
    return {
        c.name: c
        for c in V.standard_captures(("convolutions", "losses_raw", "histograms", "grouped_mm"))
    }


def node_where(cap: V.CapturedGraph, op: str, test) -> str:
    """The first node of ``op`` whose graph JSON entry satisfies ``test``."""
    return next(n["name"] for n in cap.graph["nodes"] if n["op"] == op and test(n))


def input_shape(cap: V.CapturedGraph, node: dict, k: int) -> list:
    ref = node["args"][k]
    producer = next(n for n in cap.graph["nodes"] if n["name"] == ref["ref"])
    return producer["outputs"][ref["index"]]["shape"]


@pytest.mark.parametrize("fault", ["overlapping windows", "grouped channels"])
def test_convolution_shards_the_rules_leave_out_fail(cases, fault):
    cap = cases["convolutions"]
    if fault == "overlapping windows":  # conv1d, kernel 3 at stride 2: a split cuts windows
        node = node_where(cap, "aten.convolution.default", lambda n: n["args"][3] == [2])
        planted = ([["S(2)"], ["R"], ["R"]], [["S(2)"]])
    else:  # groups=2: a local call would pair the wrong channel groups
        node = node_where(cap, "aten.convolution.default", lambda n: n["args"][8] == 2)
        planted = ([["R"], ["S(0)"]], [["S(1)"]])
    text = V.strategy_str({"inputs": planted[0], "outputs": planted[1]})
    assert text not in offered(cap, node, (2,))
    report = V.validate(
        cap, (2,), ops={"aten.convolution.default"}, extra_strategies=plant(node, planted)
    )
    assert failed(report, node) == {text}, report.summary()


def test_grouped_rows_split_with_global_offsets_fail(cases):
    cap = cases["grouped_mm"]
    node = node_where(
        cap,
        "aten._grouped_mm.default",  # [M,K] x [G,K,N]
        lambda n: [len(input_shape(cap, n, k)) for k in (0, 1)] == [2, 3],
    )
    planted = ([["S(0)"], ["R"], ["R"]], [["S(0)"]])  # rows split, offs still global
    assert "S(0),R,R -> S(0)" not in offered(cap, node, (2,))
    report = V.validate(
        cap, (2,), ops={"aten._grouped_mm.default"}, extra_strategies=plant(node, planted)
    )
    assert failed(report, node) == {"S(0),R,R -> S(0)"}, report.summary()


def test_histc_and_its_int_offsets_keep_partial_sums_only_where_exact(cases):
    cap = cases["histograms"]
    ranged = node_where(cap, "aten.histc.default", lambda n: len(n["args"]) == 4)
    data_range = node_where(cap, "aten.histc.default", lambda n: len(n["args"]) == 2)
    cumsum = node_where(cap, "aten.cumsum.default", lambda n: True)
    assert "S(0) -> P(sum)" in offered(cap, ranged, (2,))
    assert "S(0) -> P(sum)" not in offered(cap, data_range, (2,))
    assert "P(sum) -> P(sum)" not in offered(cap, cumsum, (2,))  # float counts -> int32
    report = V.validate(
        cap,
        (2,),
        ops={"aten.histc.default", "aten.cumsum.default"},
        extra_strategies=lambda node, _: (
            plant(data_range, ([["S(0)"]], [["P(sum)"]]))(node, _)
            + plant(cumsum, ([["P(sum)"]], [["P(sum)"]]))(node, _)
        ),
    )
    print(report.summary())
    assert failed(report, data_range) == {"S(0) -> P(sum)"}
    assert failed(report, cumsum) == {"P(sum) -> P(sum)"}
    assert {f.node for f in report.failures} == {data_range, cumsum}


def test_sharded_mean_loss_backward_fails(cases):
    # the kernel divides by the LOCAL element count (trace/decompositions.py rewrites mean losses as sums)
    cap = cases["losses_raw"]
    node = node_where(cap, "aten.mse_loss_backward.default", lambda n: n["args"][3] == 1)
    assert "R,S(0),S(0) -> S(0)" not in offered(cap, node, (2,))
    report = V.validate(
        cap,
        (2,),
        ops={"aten.mse_loss_backward.default"},
        extra_strategies=plant(node, ([["R"], ["S(0)"], ["S(0)"]], [["S(0)"]])),
    )
    assert failed(report, node) == {"R,S(0),S(0) -> S(0)"}, report.summary()
