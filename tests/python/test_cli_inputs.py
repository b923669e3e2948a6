"""Inputs that used to give a Python traceback or a silently wrong result through the
`autoshard` console script and the options the Python API sends (issue 11): byte-order marks,
bytes and file names that are not UTF-8, cut-off gzip files, directories, an --out path that
is the input, budgets below 1/mesh size, non-positive limits and non-finite time limits."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GRAPH = ROOT / "tests" / "cpp" / "data" / "linear_fwd.json"

PROBLEM = {
    "problem": {
        "nodes": {
            "costs": [[1, 2], [3, 1]],
            "usages": [[1, 1], [1, 1]],
            "intervals": [[0, 1], [0, 1]],
        },
        "edges": {"nodes": [[0, 1]], "costs": [[0, 1, 1, 0]]},
        "usage_limit": 10,
    }
}


def script(args, timeout=120):
    """The real console script, with arguments given as bytes (file names need not be UTF-8)."""
    exe = shutil.which("autoshard")
    cmd = [exe] if exe else [sys.executable, "-m", "autoshard.tools.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, timeout=timeout)


def core(args):
    from autoshard import _core

    return _core.cli_main(list(args))


def test_console_script_reads_or_names_bad_bytes_without_a_traceback(tmp_path):
    text = json.dumps(PROBLEM).encode()
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + text)
    latin = tmp_path / "latin.json"
    latin.write_bytes(text.replace(b'"problem"', b'"probl\xe9m"'))
    odd_name = os.fsencode(tmp_path) + b"/\xff.json"
    with open(odd_name, "wb") as f:
        f.write(b"{")
    for path, rc, expected in [
        (bom, 0, b"proven optimal"),
        (latin, 1, b"byte 0xE9 in a string is not valid UTF-8"),
        (odd_name, 1, b"\\xff.json"),
    ]:
        proc = script(["solve", path])
        assert b"Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == rc, proc.stderr
        assert expected in proc.stdout + proc.stderr


def test_truncated_gzip_and_directories_are_named(tmp_path):
    data = gzip.compress(json.dumps(PROBLEM).encode())
    for cut in (1, 4, 8):
        path = tmp_path / f"cut{cut}.json.gz"
        path.write_bytes(data[:-cut])
        rc, out, err = core(["solve", str(path)])
        assert rc == 1 and "is a truncated or damaged gzip file" in err, err
    folder = tmp_path / "problem.json"
    folder.mkdir()
    for cmd in (["solve", str(folder)], ["plan", str(folder), "--mesh", "4"]):
        rc, out, err = core(cmd)
        assert rc == 1 and "is a directory, not a file" in err, err


def test_out_path_equal_to_the_input_is_refused(tmp_path):
    problem = tmp_path / "p.json"
    problem.write_text(json.dumps(PROBLEM))
    before = problem.read_bytes()
    rc, out, err = core(["solve", str(problem), "--out", str(tmp_path / "." / "p.json")])
    assert rc == 2 and "would overwrite the input" in err, err
    graph = tmp_path / "g.json"
    shutil.copy(GRAPH, graph)
    rc, out, err = core(["plan", str(graph), "--mesh", "4", "--out", str(graph)])
    assert rc == 1 and "would overwrite the input" in err, err
    assert problem.read_bytes() == before and graph.read_bytes() == GRAPH.read_bytes()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--param-memory", "0,0"], "high=0 is below 0.25 = 1/4"),
        (["--param-memory", "0,1e-9"], "high=1e-09 is below 0.25 = 1/4"),
        (["--memory-limit", "-1"], "--memory-limit (leave it out for no limit): must be > 0 bytes"),
        (["--time-limit", "0"], "--time-limit must be a finite number of seconds > 0, got 0"),
        (["--time-limit", "inf"], "--time-limit must be a finite number of seconds > 0, got inf"),
    ],
)
def test_plan_options_are_checked(args, expected):
    rc, out, err = core(["plan", str(GRAPH), "--mesh", "4"] + args)
    assert rc == 1 and expected in err, err


def test_options_json_from_the_python_api_is_checked():
    """What AutoParallel sends for add_parameter_memory_constraint(high=0.1) and for
    time_limit_s=inf (json.dumps writes Infinity)."""
    from autoshard import _core

    graph = GRAPH.read_text()
    base = {"mesh": {"shape": [4]}}
    with pytest.raises(
        ValueError, match=r"high=0.1 is below 0.25 = 1/4.*add_parameter_memory_constraint"
    ):
        _core.plan_graph(graph, json.dumps({**base, "parameter_memory": {"low": 0.0, "high": 0.1}}))
    with pytest.raises(ValueError, match=r'"time_limit_s": NaN and Infinity are not JSON numbers'):
        _core.plan_graph(graph, json.dumps({**base, "time_limit_s": float("inf")}))
    with pytest.raises(ValueError, match=r"memory_limit_bytes: must be > 0 bytes per GPU"):
        _core.plan_graph(graph, json.dumps({**base, "memory_limit_bytes": -1}))
    plan = json.loads(_core.plan_graph(graph, json.dumps({**base, "time_limit_s": 1e10})))
    assert plan["summary"]["total_us"] > 0


def test_costs_are_exact_or_refused(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(
        '{"problem": {"nodes": {"costs": [[999999999999999999, 5], [0]]},'
        ' "edges": {"nodes": [[0, 1]], "costs": [[0, 0]]}}}'
    )
    rc, out, err = core(["solve", str(path)])
    assert rc == 1 and "cost 999999999999999999 cannot be represented exactly" in err, err
    path.write_text(
        '{"problem": {"nodes": {"costs": [[123456789012346, 123456789012345], [0]]},'
        ' "edges": {"nodes": [[0, 1]], "costs": [[0, 0]]}}}'
    )
    rc, out, err = core(["solve", str(path)])
    assert rc == 0 and "cost: 123456789012345\n" in out, out
