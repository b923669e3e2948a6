"""The derived solver benchmark's bookkeeping (bench/derived.py, bench/derive_instances.py):
a reference belongs to the exact instance text it was measured on, and a kept base plan
that does not fit its source stops the derivation instead of deriving from garbage."""

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import derive_instances  # noqa: E402
import derived  # noqa: E402

TINY = {
    "nodes": {
        "intervals": [[0, 2], [1, 3]],
        "costs": [[5, 7], [1, derived.INF]],
        "usages": [[1, 2], [3, 4]],
    },
    "edges": {"nodes": [[0, 1]], "costs": [[0, 1, 2, 3]]},
    "usage_limit": 10,
}


def _write_gz(path, obj, level):
    with gzip.open(path, "wb", compresslevel=level) as f:
        f.write(json.dumps(obj).encode())


def test_digest_is_of_the_text_not_of_the_gzip_bytes(tmp_path):
    a, b, c = tmp_path / "a.json.gz", tmp_path / "b.json.gz", tmp_path / "c.json.gz"
    _write_gz(a, {"problem": TINY}, 1)
    _write_gz(b, {"problem": TINY}, 9)
    _write_gz(c, {"problem": dict(TINY, usage_limit=11)}, 9)
    assert a.read_bytes() != b.read_bytes()
    assert derived.digest(a) == derived.digest(b) != derived.digest(c)


def test_reference_keeps_the_best_and_follows_its_file(capsys):
    refs = {}
    derived.merge_ref(refs, "X.json.gz", {"cost": 10, "lb": 8}, "run 60s", "aa")
    derived.merge_ref(refs, "X.json.gz", {"cost": 12, "lb": 9}, "run 15s", "aa")
    assert derived.ref_of(refs, "X.json.gz", "aa") == {
        "cost": 10,
        "lb": 9,
        "kind": "run 60s",
        "sha256": "aa",
    }
    derived.merge_ref(refs, "X.json.gz", {"cost": 9, "lb": 9}, "run 60s", "aa")
    assert refs["X.json.gz"]["kind"] == "optimal"

    # Regenerated differently: the old figures say nothing about the new file.
    assert derived.ref_of(refs, "X.json.gz", "bb") == {}
    assert "for another file" in capsys.readouterr().out
    derived.merge_ref(refs, "X.json.gz", {"cost": 20, "lb": None}, "run 15s", "bb")
    assert refs["X.json.gz"] == {"cost": 20, "lb": None, "kind": "run 15s", "sha256": "bb"}


def test_kept_base_plan_must_fit_its_source(tmp_path):
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    src = tmp_path / "T.json.gz"

    def keep(plan):
        _write_gz(base_dir / "T.sol.json.gz", {"solution": plan}, 6)

    keep([1, 0])
    assert derive_instances.base_plan(None, "T", src, tmp_path, TINY, base_dir) == [1, 0]
    for bad in ([1], [2, 0], [0, 1]):  # too short, out of range, infeasible strategy
        keep(bad)
        with pytest.raises(SystemExit, match="--fresh-base"):
            derive_instances.base_plan(None, "T", src, tmp_path, TINY, base_dir)


def _ring(n):
    """A ring of n nodes with a chord, overlapping live intervals: a source for the dense
    generator (bench/derived_dense.py) that needs no public instance."""
    edges = [[i, (i + 1) % n] for i in range(n)] + [[0, n // 2]]
    return {
        "nodes": {
            "intervals": [[i, i + 3] for i in range(n)],
            "costs": [[1, 2] for _ in range(n)],
            "usages": [[1, 1] for _ in range(n)],
        },
        "edges": {"nodes": edges, "costs": [[0, 1, 1, 0] for _ in edges]},
        "usage_limit": 10,
    }


@pytest.mark.parametrize("mesh,sub", [((2, 4, 4), None), ((4, 4, 4), 6)])
def test_dense_generator_writes_well_formed_problems(tmp_path, mesh, sub):
    import derived_dense

    src = tmp_path / "ring.json.gz"
    derive_instances.save(_ring(12), src)
    q = derived_dense.synthetic(src, mesh, (1.0, 4.0, 4.0), 0.5, 3, 100, 0.5, sub)
    costs, usages = q["nodes"]["costs"], q["nodes"]["usages"]
    assert len(costs) == (sub or 12) == len(usages) == len(q["nodes"]["intervals"])
    assert all(1 < len(r) <= derived_dense.MAX_STRATEGIES for r in costs)
    for (u, v), m in zip(q["edges"]["nodes"], q["edges"]["costs"]):
        assert len(m) == len(costs[u]) * len(costs[v])
    # the limit is the least-usage peak (tightness has no room in this model), so the
    # smallest layouts fit and pinning leaves each node at least one strategy
    least = [min(range(len(u)), key=lambda s: u[s]) for u in usages]
    assert derive_instances.peak_usage(q, least) <= q["usage_limit"]
    pq, removed = derived_dense.pinned(q)
    assert removed >= 0
    assert all(min(r) < derived_dense.INFEASIBLE for r in pq["nodes"]["costs"])
    # seeded: the same problem again
    assert derived_dense.synthetic(src, mesh, (1.0, 4.0, 4.0), 0.5, 3, 100, 0.5, sub) == q


# Three nodes, two labels, every edge free only where its ends differ: no plan avoids paying
# one edge (an odd cycle).
FRUSTRATED_TRIANGLE = {
    "nodes": {"intervals": [[0, 1]] * 3, "costs": [[0, 0]] * 3, "usages": [[1, 1]] * 3},
    "edges": {"nodes": [[0, 1], [1, 2], [0, 2]], "costs": [[1, 0, 0, 1]] * 3},
    "usage_limit": 3,
}


def test_local_lp_pays_nothing_on_a_frustrated_triangle():
    # The local polytope mixes each node 50/50 and pays nothing, the half-integral shape the
    # LP takes on the mesh3d-4x4x4 problems.
    pytest.importorskip("scipy")
    import derived_dense

    value, _, shape = derived_dense.local_lp(FRUSTRATED_TRIANGLE, rows=True)
    assert value == pytest.approx(0.0, abs=1e-9)
    assert shape == {(2, 0.5): 3}


def test_cycle_cuts_close_the_frustrated_triangle():
    # One round of cycle inequalities (bench/cycle_cuts.py) finds a cycle
    # the LP violates by the whole unit, and with its cuts the LP pays the one edge every
    # plan pays (the optimum, 1).
    pytest.importorskip("scipy")
    import cycle_cuts
    import derived_dense

    lp = derived_dense.LocalLP(FRUSTRATED_TRIANGLE)
    found = cycle_cuts.separate(lp, lp.solve().x, max_cuts=10)
    assert found and max(v for _, v in found) == pytest.approx(1.0, abs=1e-6)
    cuts = [cycle_cuts.cut_row(lp, walk) for walk, _ in found]
    assert lp.solve(*cycle_cuts.cut_matrix(lp, cuts)).fun == pytest.approx(1.0, abs=1e-6)
