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
