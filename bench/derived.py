#!/usr/bin/env python3
"""Score `autoshard solve` on the derived instances of bench/derive_instances.py (issue 12).

Two steps, both on the folder the derive script wrote (default /tmp/autoshard_derived):

    python3 bench/derived.py --refs                  # references (long runs)
    python3 bench/derived.py --time-scale 0.25       # score runs at 25% of each time limit

References live in bench/derived_refs.json (committed, so that a fresh machine scores at
once), each with a digest of the instance it belongs to: a file that differs (other base
plans, another planner version) is scored as having none, and its new reference replaces the
old one.

Reference per instance: up to --exact-nodes nodes, `solve --exact` for --exact-limit s (a
proven optimum when it finishes); otherwise, or when that proves nothing, the best cost of
a run at --ref-scale x the instance's time limit. The best lower bound seen by any run is
kept too, so "gap" (cost / lower bound - 1) is a reference-free measure. Reruns only
improve the references (best cost, highest bound); a score run that beats the reference
updates it as well and shows a score above 1 (the reference was weak).

Every plan is checked here, independently of the solver: the solution file is re-evaluated
(cost, every strategy in range and finite, memory at every time point); a plan failing that
scores 0 and is flagged INVALID.
"""

import argparse
import fnmatch
import gzip
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iopddl import field, find_cli, run_one  # noqa: E402

INF = 10**18
DEFAULT_DIR = Path("/tmp/autoshard_derived")
REFS = Path(__file__).resolve().parent / "derived_refs.json"


def _text(path):
    """The problem file's JSON text, as bytes (gzip or plain)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read()


def _digest_of(text):
    """First 16 hex digits of the sha256 of a problem's JSON text. Of the text, not of the
    .gz file: gzip's bytes may differ between zlib versions for the same text."""
    return hashlib.sha256(text).hexdigest()[:16]


def read_problem(path):
    """(problem, digest) from one read of the file."""
    text = _text(path)
    return json.loads(text)["problem"], _digest_of(text)


def load(path):
    return read_problem(path)[0]


def digest(path):
    return _digest_of(_text(path))


def evaluate(p, sol):
    """(cost, None) for a valid plan, else (None, reason). Budgets (planner problems) are
    checked too: low <= sum of the chosen per-node bytes <= high."""
    costs, usages, iv = p["nodes"]["costs"], p["nodes"]["usages"], p["nodes"]["intervals"]
    if len(sol) != len(costs):
        return None, f"{len(sol)} entries for {len(costs)} nodes"
    total = 0
    delta = {}
    for i, s in enumerate(sol):
        if not 0 <= s < len(costs[i]) or costs[i][s] >= INF:
            return None, f"node {i}: strategy {s} out of range or infeasible"
        total += costs[i][s]
        a, b = iv[i]
        if a < b and usages[i][s]:
            delta[a] = delta.get(a, 0) + usages[i][s]
            delta[b] = delta.get(b, 0) - usages[i][s]
    for (u, v), m in zip(p["edges"]["nodes"], p["edges"]["costs"]):
        c = m[sol[u] * len(costs[v]) + sol[v]]
        if c >= INF:
            return None, f"edge ({u},{v}): infeasible pair"
        total += c
    cur = 0
    for t in sorted(delta):
        cur += delta[t]
        if cur > p["usage_limit"]:
            return None, f"memory {cur} > {p['usage_limit']} at t={t}"
    for b in p.get("budgets", []) or []:
        # Same shape as docs/formats.md section 4; skipped silently if it differs.
        try:
            used = sum(b["usages"][i][sol[i]] for i in range(len(sol)) if b["usages"][i])
            if used < b.get("low", 0) or (
                "high" in b and b["high"] is not None and used > b["high"]
            ):
                return None, f"budget {used} outside [{b.get('low')}, {b.get('high')}]"
        except (KeyError, TypeError, IndexError):
            pass
    return total, None


def solve(cli, path, limit, extra):
    """Runs the solver with --out; returns dict(cost, lb, wall, status, invalid, digest).
    The file is read once, after the run, for both the plan's check and the digest."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sol.json"
        rc, stdout, err, wall, _ = run_one(cli, path, limit, extra + ["--out", str(out)])
        lb_s = field(stdout, "lower bound")
        res = {
            "wall": wall,
            "lb": float(lb_s) if lb_s not in (None, "none") else None,
            "cost": None,
            "status": field(stdout, "status") or "",
            "invalid": None,
        }
        if "proven optimal" in stdout:
            res["status"] = "proven optimal"
        problem, res["digest"] = read_problem(path)
        if rc != 0 or not out.exists():
            res["status"] = f"rc={rc} " + (
                err.strip().splitlines()[-1] if err.strip() else "no plan"
            )
            return res
        sol = json.loads(out.read_text())["solution"]
    cost, why = evaluate(problem, sol)
    if cost is None:
        res["invalid"] = why
        res["status"] = "INVALID: " + why
        return res
    reported = field(stdout, "cost")
    if reported is not None and abs(float(reported) - cost) > 0.5:
        res["status"] += f" (solver said {reported}, recomputed {cost})"
    res["cost"] = cost
    return res


def load_refs(path):
    return json.loads(Path(path).read_text()) if Path(path).exists() else {}


def save_refs(refs, path):
    Path(path).write_text(json.dumps(refs, indent=1, sort_keys=True) + "\n")


def ref_of(refs, name, dig):
    """The reference of instance `name` whose file has digest `dig`, else {}."""
    r = refs.get(name, {})
    if r and r.get("sha256") != dig:
        print(f"note: the reference of {name} is for another file (digest {r.get('sha256')})")
        return {}
    return r


def merge_ref(refs, name, res, kind, dig):
    """Keeps the best cost and the highest lower bound over all runs on the file with digest
    `dig`; a reference of another file is replaced."""
    if refs.get(name, {}).get("sha256") != dig:
        refs[name] = {"cost": None, "lb": None, "kind": None, "sha256": dig}
    r = refs[name]
    if res["cost"] is not None and (r["cost"] is None or res["cost"] < r["cost"]):
        r["cost"], r["kind"] = res["cost"], kind
    if res["lb"] is not None and (r["lb"] is None or res["lb"] > r["lb"]):
        r["lb"] = res["lb"]
    if r["cost"] is not None and r["lb"] is not None and r["lb"] >= r["cost"] - 0.25:
        r["kind"] = "optimal"


def select(manifest, only, max_nodes):
    names = sorted(manifest)
    if only:
        pats = [s.strip() for s in only.split(",") if s.strip()]
        names = [
            n for n in names if any(fnmatch.fnmatch(n, p if "*" in p else f"*{p}*") for p in pats)
        ]
    return [n for n in names if manifest[n]["nodes"] <= max_nodes]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="folder of derive_instances.py")
    ap.add_argument("--only", help="comma list of name substrings or globs, e.g. B-,sub500")
    ap.add_argument("--max-nodes", type=int, default=10**9, help="skip instances with more nodes")
    ap.add_argument("--cli", help="autoshard-cli path (default as bench/iopddl.py)")
    ap.add_argument(
        "--extra", action="append", default=[], help="extra option passed to solve (repeatable)"
    )
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply every time limit")
    ap.add_argument("--refs", action="store_true", help="compute references instead of scoring")
    ap.add_argument(
        "--exact-nodes", type=int, default=5000, help="--refs: try --exact up to this many nodes"
    )
    ap.add_argument(
        "--exact-limit", type=float, default=120, help="--refs: seconds for the exact run"
    )
    ap.add_argument(
        "--ref-scale", type=float, default=2.0, help="--refs: long run at this x the time limit"
    )
    ap.add_argument("--json-out", help="also write the per-instance results there")
    ap.add_argument(
        "--refs-file",
        default=str(REFS),
        help="references to score against and improve (default %(default)s)",
    )
    args = ap.parse_args(argv)
    d = Path(args.dir)
    manifest = json.loads((d / "manifest.json").read_text())
    refs = load_refs(args.refs_file)
    cli = find_cli(args.cli)
    names = select(manifest, args.only, args.max_nodes)

    if args.refs:
        for name in names:
            m = manifest[name]
            dig = digest(d / name)
            if m["nodes"] <= args.exact_nodes:
                res = solve(cli, d / name, args.exact_limit, ["--exact"])
                merge_ref(refs, name, res, f"exact {args.exact_limit:g}s", dig)
                print(
                    f"{name}: exact -> {res['status']} cost {res['cost']} lb {res['lb']} ({res['wall']:.1f} s)",
                    flush=True,
                )
            if ref_of(refs, name, dig).get("kind") != "optimal":
                limit = m["time_limit"] * args.ref_scale
                res = solve(cli, d / name, limit, [])
                merge_ref(refs, name, res, f"run {limit:g}s", dig)
                print(
                    f"{name}: long run -> {res['status']} cost {res['cost']} lb {res['lb']} ({res['wall']:.1f} s)",
                    flush=True,
                )
            save_refs(refs, args.refs_file)
        return 0

    print(
        f"solver: {' '.join(cli)}   time scale: {args.time_scale:g}   extra: {' '.join(args.extra) or '-'}"
    )
    hdr = (
        f"{'instance':22} {'nodes':>6} {'S':>4} {'limit':>6} {'cost':>18} {'reference':>18} {'ref':>8} "
        f"{'score':>7} {'gap':>8} {'time':>6}  status"
    )
    print(hdr)
    print("-" * len(hdr))
    total, rows = 0.0, []
    for name in names:
        m = manifest[name]
        limit = m["time_limit"] * args.time_scale
        res = solve(cli, d / name, limit, args.extra)
        dig = res["digest"]
        r = ref_of(refs, name, dig)
        ref = r.get("cost")
        if ref is None and res["status"] == "proven optimal":  # its own reference: an optimum
            r, ref = {"kind": "optimal"}, res["cost"]
        score = 0.0
        if res["cost"] is not None:
            score = (
                (ref / res["cost"] if res["cost"] > 0 else 1.0) if ref is not None else float("nan")
            )
        lb = max([x for x in (res["lb"], r.get("lb")) if x is not None], default=None)
        gap = (res["cost"] / lb - 1) if res["cost"] is not None and lb else None
        total += 0.0 if score != score else score
        kind = {"optimal": "optimum"}.get(r.get("kind"), "best run" if ref is not None else "none")
        cost_txt = f"{res['cost']:,}" if res["cost"] is not None else "-"
        ref_txt = f"{ref:,}" if ref is not None else "-"
        gap_txt = f"{100 * gap:.3f}%" if gap is not None else "-"
        print(
            f"{name:22} {m['nodes']:6} {m['max_strategies']:4} {limit:6.1f} {cost_txt:>18} {ref_txt:>18} "
            f"{kind:>8} {score:7.4f} {gap_txt:>8} {res['wall']:6.1f}  {res['status']}",
            flush=True,
        )
        rows.append(
            dict(name=name, limit=limit, score=score, gap=gap, ref=ref, ref_kind=kind, **res)
        )
        merge_ref(refs, name, res, f"score run {limit:g}s", dig)
        save_refs(refs, args.refs_file)
    print(
        f"total score: {total:.4f} / {len(names)}   below 0.99: "
        f"{sum(1 for r in rows if r['score'] < 0.99)}   invalid: {sum(1 for r in rows if r['invalid'])}"
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
