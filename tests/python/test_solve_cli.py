"""`autoshard solve` end to end through the pip-installed console script: the printed cost
matches a brute force written here in Python, the plan file is valid, and malformed files
and options get errors that name the problem."""

from __future__ import annotations

import itertools
import json
import random
import re
import shutil
import subprocess
import sys

import pytest


def autoshard_cmd() -> list[str]:
    script = shutil.which("autoshard")
    return [script] if script else [sys.executable, "-m", "autoshard.tools.cli"]


def run_script(args, timeout=300):
    """The real console script in a subprocess (slow to start: it imports torch)."""
    return subprocess.run(
        autoshard_cmd() + list(args), capture_output=True, text=True, timeout=timeout
    )


class _Result:
    def __init__(self, rc, out, err):
        self.returncode, self.stdout, self.stderr = rc, out, err


def run(args):
    """The same C++ command line the console script forwards to, called in-process (the
    script's own forwarding is covered by the run_script tests)."""
    from autoshard import _core

    return _Result(*_core.cli_main(list(args)))


def random_problem(seed: int) -> dict:
    rng = random.Random(seed)
    n = 6
    costs, usages, intervals = [], [], []
    for _ in range(n):
        k = rng.randint(1, 3)
        costs.append([rng.choice([rng.randint(0, 100)] * 6 + [10**18]) for _ in range(k)])
        usages.append([rng.randint(0, 10) for _ in range(k)])
        a = rng.randint(0, 5)
        intervals.append([a, a + rng.randint(0, 4)])
    enodes, ecosts = [], []
    for v in range(1, n):
        u = rng.randint(0, v - 1)
        enodes.append([u, v])
        ecosts.append([rng.randint(0, 40) for _ in range(len(costs[u]) * len(costs[v]))])
    return {
        "problem": {
            "name": f"rand{seed}",
            "nodes": {"costs": costs, "usages": usages, "intervals": intervals},
            "edges": {"nodes": enodes, "costs": ecosts},
            "usage_limit": 22,
        }
    }


def plan_cost(p: dict, plan) -> int | None:
    """Cost of a plan, or None when it is invalid (infeasible choice or memory over the limit
    at some integer time point, intervals half-open)."""
    nodes = p["nodes"]
    total = 0
    for i, s in enumerate(plan):
        total += nodes["costs"][i][s]
    for (u, v), m in zip(p["edges"]["nodes"], p["edges"]["costs"]):
        total += m[plan[u] * len(nodes["costs"][v]) + plan[v]]
    if any(nodes["costs"][i][s] >= 10**18 for i, s in enumerate(plan)):
        return None
    horizon = max(b for _, b in nodes["intervals"]) + 1
    for t in range(horizon):
        live = sum(
            nodes["usages"][i][s]
            for i, s in enumerate(plan)
            if nodes["intervals"][i][0] <= t < nodes["intervals"][i][1]
        )
        if live > p["usage_limit"]:
            return None
    return total


def brute_force(p: dict):
    best = None
    for plan in itertools.product(*[range(len(c)) for c in p["nodes"]["costs"]]):
        c = plan_cost(p, plan)
        if c is not None and (best is None or c < best):
            best = c
    return best


@pytest.mark.parametrize("seed", range(8))
def test_printed_cost_matches_brute_force(tmp_path, seed):
    doc = random_problem(seed)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    out_path = tmp_path / "sol.json"
    best = brute_force(doc["problem"])
    proc = run(["solve", str(path), "--time-limit", "10", "--out", str(out_path)])
    if best is None:
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "no valid plan found" in proc.stdout
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cost = int(re.search(r"^cost: (\d+)$", proc.stdout, re.M).group(1))
    assert cost == best
    assert "proven optimal" in proc.stdout
    assert re.search(r"^lower bound: (\d+)$", proc.stdout, re.M).group(1) == str(best)
    assert re.search(r"^peak memory: \d+ / limit 22 ", proc.stdout, re.M)
    plan = json.loads(out_path.read_text())["solution"]
    assert plan_cost(doc["problem"], plan) == best


def test_infeasible_problem_exits_nonzero(tmp_path):
    doc = {
        "problem": {
            "nodes": {"costs": [[1, 2]], "usages": [[5, 6]], "intervals": [[0, 1]]},
            "edges": {"nodes": [], "costs": []},
            "usage_limit": 4,
        }
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    proc = run(["solve", str(path), "--time-limit", "5"])
    assert proc.returncode == 3
    assert "no valid plan found" in proc.stdout


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"problem": {\n "nodes": [1,,]}}', "line 2"),
        (
            '{"problem": {"nodes": {"costs": [[1, 2], [3]]}, "edges": {"nodes": [[0, 1]], "costs": [[1, 2, 3]]}}}',
            "problem.edges.costs[0]: edge 0 (0 -> 1) has 3 costs but needs |S_u| x |S_v| = 2 x 1 = 2",
        ),
        (
            '{"problem": {"nodes": {"costs": [[1]]}, "edges": {"nodes": [[0, 3]], "costs": [[1]]}}}',
            "problem.edges.nodes[0][1]: node id 3 is out of range",
        ),
        (
            '{"problem": {"nodes": {"costs": [[1]], "usages": [[1]], "intervals": [[5, 2]]}, '
            '"edges": {"nodes": [], "costs": []}, "usage_limit": 3}}',
            "interval end 2 is before its start 5",
        ),
        (
            '{"problem": {"nodes": {"costs": [[1]], "usages": [[-1]], "intervals": [[0, 2]]}, '
            '"edges": {"nodes": [], "costs": []}, "usage_limit": 3}}',
            "problem.nodes.usages[0][0]: negative usage -1",
        ),
        (
            '{"problem": {"nodes": {"costs": [[]]}, "edges": {"nodes": [], "costs": []}}}',
            "node 0 has no strategies",
        ),
        (
            '{"problem": {"nodes": {}, "edges": {"nodes": [], "costs": []}}}',
            'problem.nodes: missing key "costs"',
        ),
    ],
)
def test_malformed_files_are_reported(tmp_path, text, expected):
    path = tmp_path / "bad.json"
    path.write_text(text)
    proc = run(["solve", str(path)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert str(path) in proc.stderr


def test_console_script_end_to_end(tmp_path):
    doc = next(d for d in map(random_problem, range(100)) if brute_force(d["problem"]) is not None)
    best = brute_force(doc["problem"])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    proc = run_script(["solve", str(path), "--time-limit", "10"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"cost: {best}\n" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"problem": {"nodes": {"costs": [[1]]}, "edges": {"nodes": [[0, 3]], "costs": [[1]]}}}'
    )
    proc = run_script(["solve", str(bad)])
    assert proc.returncode == 1
    assert "problem.edges.nodes[0][1]: node id 3 is out of range" in proc.stderr


def test_missing_file_and_bad_options(tmp_path):
    proc = run(["solve", str(tmp_path / "nope.json")])
    assert proc.returncode == 1 and "nope.json" in proc.stderr
    proc = run(["solve"])
    assert proc.returncode == 2 and "missing PROBLEM file" in proc.stderr
    proc = run(["solve", "x.json", "--time-limit", "abc"])
    assert proc.returncode == 2 and "--time-limit expects a number" in proc.stderr
    proc = run(["solve", "x.json", "--frobnicate"])
    assert proc.returncode == 2 and "unknown option '--frobnicate'" in proc.stderr
    proc = run(["solve", "--help"])
    assert proc.returncode == 0 and "--time-limit" in proc.stdout
    proc = run(["solve", "x.json", "--milp-log", str(tmp_path / "no_dir" / "milp.log")])
    assert proc.returncode == 2 and "--milp-log" in proc.stderr and "does not exist" in proc.stderr
