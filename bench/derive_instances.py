#!/usr/bin/env python3
"""Derive new solver problems from the public IOPDDL instances (issue 12), deterministically.

The seven public files are what the solver was tuned on; these variants check that it
generalises. Families (each one file per source instance, same gzip JSON format):

  memX     usage_limit scaled by X (0.9, 0.97, 1.1) of the original limit
  memmid   usage_limit halfway between the peak of the per-node minimum usages (below it
           nothing fits) and the base plan's peak: tighter than the original, still feasible
           in all likelihood (0.9 is provably infeasible for B and G)
  perturb  every finite node and edge cost times lognormal(0, sigma) noise
  subN     connected subgraph of ~N nodes (BFS from a seeded random node); its memory limit
           is the peak usage of the base plan restricted to those nodes, so it stays feasible
           and binding; a draw that tests nothing (a greedy plan fits and costs within 5 %
           of the sum of per-node and per-edge minima) is redrawn
  subsetF  each node keeps a random fraction F of its strategies (always the base plan's)
  cloneK   nodes with few strategies get up to K near-copies of existing strategies (costs
           x lognormal noise): near-ties the search has to tell apart

"Base plan": a fixed valid plan of each source instance, kept in bench/derived_base/ so that
the derived files, and so the references of bench/derived_refs.json, stay the same from
solver version to solver version. A source without one there (another --dir, or
--fresh-base) gets one from `autoshard solve --work-limit` (the same plan on every machine
for one solver version), cached in OUT/base/. Families that keep it valid (perturb, sub,
subset, clone, mem1.1) are feasible by construction; for mem0.9/0.97 the script checks the
necessary condition "peak of the per-node minimum usage <= limit" and skips the instance
when it fails.

    python3 bench/derive_instances.py                    # default set -> /tmp/autoshard_derived
    python3 bench/derive_instances.py --only B,G --families mem0.9,perturb --out DIR
    python3 bench/derive_instances.py --planner          # also autoshard's own planner problems

Writes OUT/manifest.json (per instance: source, family, nodes, time limit, notes). Generated
files are never committed: rerun the script (same seed and base plans -> same files).
"""

import argparse
import gzip
import json
import math
import random
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derived import INF, evaluate, load  # noqa: E402
from iopddl import DEFAULT_DIR, INSTANCES, find_cli  # noqa: E402

DEFAULT_OUT = Path("/tmp/autoshard_derived")
REPO = Path(__file__).resolve().parents[1]
BASE_DIR = REPO / "bench" / "derived_base"
DEFAULT_FAMILIES = "mem0.9,mem0.97,mem1.1,memmid,perturb,sub500,sub2000,subset0.5,clone2"
# Big sources get only the families that change a scalar or a few numbers per entry; the
# strategy-changing ones multiply already large edge tables.
SMALL_ONLY = ("clone",)
# Work units for the base plan (~0.2 s per 1e8 on one core; B is proven optimal in 1e8).
BASE_WORK = {"B": 4e8, "G": 4e8}
BASE_WORK_DEFAULT = 3e9


def save(problem, path):
    # mtime=0: byte-identical files from run to run (gzip stores a timestamp otherwise).
    data = json.dumps({"problem": problem}, separators=(",", ":")).encode()
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as f,
    ):
        f.write(data)


def base_plan(cli, name, src, out, p, base_dir):
    """The base plan of source `name` (list of strategy indices): bench/derived_base's (or
    `base_dir`'s) when it has one, else a cached or new solver plan."""
    kept = base_dir / f"{name}.sol.json.gz" if base_dir else None
    if kept is not None and kept.exists():
        with gzip.open(kept, "rt") as f:
            plan = json.load(f)["solution"]
        _, why = evaluate(p, plan)
        if why is not None:
            sys.exit(
                f"{kept} is not a valid plan of {src} ({why}; another instance of that "
                "name?): pass --fresh-base to derive from a new solver plan"
            )
        return plan
    sol = out / "base" / f"{name}.sol.json"
    if not sol.exists():
        sol.parent.mkdir(parents=True, exist_ok=True)
        work = BASE_WORK.get(name, BASE_WORK_DEFAULT)
        cmd = cli + [
            "solve",
            str(src),
            "--work-limit",
            f"{work:.0f}",
            "--time-limit",
            "600",
            "--out",
            str(sol),
        ]
        print("base plan:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(sol) as f:
        return json.load(f)["solution"]


def peak_usage(p, choice, keep=None):
    """Peak over time of the summed usage of the chosen strategies (nodes in `keep` only)."""
    delta = {}
    nodes = range(len(p["nodes"]["costs"])) if keep is None else keep
    for i in nodes:
        a, b = p["nodes"]["intervals"][i]
        u = (
            p["nodes"]["usages"][i][choice[i]]
            if choice is not None
            else min(p["nodes"]["usages"][i])
        )
        if a < b and u:
            delta[a] = delta.get(a, 0) + u
            delta[b] = delta.get(b, 0) - u
    peak = cur = 0
    for t in sorted(delta):
        cur += delta[t]
        peak = max(peak, cur)
    return peak


def noisy(x, rng, sigma):
    """x times lognormal noise; infeasible markers and zeros stay as they are."""
    if x >= INF or x == 0:
        return x
    return max(1, int(round(x * math.exp(rng.gauss(0.0, sigma)))))


def fam_mem(p, factor, base):
    q = dict(p)
    need = peak_usage(p, None)
    if factor is None:  # memmid
        q["usage_limit"] = (need + peak_usage(p, base)) // 2
    else:
        q["usage_limit"] = int(p["usage_limit"] * factor)
    if need > q["usage_limit"]:
        return None, f"infeasible: min-usage peak {need} > limit {q['usage_limit']}"
    bp = peak_usage(p, base)
    return (
        q,
        f"base plan peak {bp / q['usage_limit']:.3f} of new limit; min-usage peak {need / q['usage_limit']:.3f}",
    )


def fam_perturb(p, rng, sigma=0.2):
    q = dict(p)
    q["nodes"] = dict(
        p["nodes"], costs=[[noisy(c, rng, sigma) for c in row] for row in p["nodes"]["costs"]]
    )
    q["edges"] = dict(
        p["edges"], costs=[[noisy(c, rng, sigma) for c in m] for m in p["edges"]["costs"]]
    )
    return q, f"lognormal sigma {sigma}"


def restrict(p, keep, strategies=None):
    """The problem on nodes `keep` (old ids, in order) and, per kept node, the strategy lists
    `strategies[i]` (old strategy ids; all when None). Time points are renumbered densely."""
    idx = {v: k for k, v in enumerate(keep)}
    S = strategies or {v: list(range(len(p["nodes"]["costs"][v]))) for v in keep}
    nodes = p["nodes"]
    times = sorted({t for v in keep for t in nodes["intervals"][v]})
    tmap = {t: k for k, t in enumerate(times)}
    en, ec = [], []
    for (u, v), m in zip(p["edges"]["nodes"], p["edges"]["costs"]):
        if u in idx and v in idx:
            width = len(nodes["costs"][v])
            en.append([idx[u], idx[v]])
            ec.append([m[a * width + b] for a in S[u] for b in S[v]])
    return {
        "name": p.get("name", "") + "-derived",
        "nodes": {
            "intervals": [
                [tmap[nodes["intervals"][v][0]], tmap[nodes["intervals"][v][1]]] for v in keep
            ],
            "costs": [[nodes["costs"][v][s] for s in S[v]] for v in keep],
            "usages": [[nodes["usages"][v][s] for s in S[v]] for v in keep],
        },
        "edges": {"nodes": en, "costs": ec},
        "usage_limit": p["usage_limit"],
    }


def independent_bound(p):
    """Sum of every node's and every edge's cheapest finite cost: no plan costs less."""
    nodes = sum(min(c for c in row if c < INF) for row in p["nodes"]["costs"])
    return nodes + sum(min(c for c in m if c < INF) for m in p["edges"]["costs"])


def greedy_plan(p, start=None, sweeps=20):
    """Single-node moves to the cheapest strategy given the neighbours' (iterated conditional
    modes) from `start`, else from each node's cheapest strategy; ties go to the least usage
    (so the plan has a chance to fit), the memory limit itself is ignored. Deterministic."""
    costs, width, usage = (
        p["nodes"]["costs"],
        [len(r) for r in p["nodes"]["costs"]],
        p["nodes"]["usages"],
    )
    adj = [[] for _ in costs]  # (edge index, other node, this node is the row)
    for e, (u, v) in enumerate(p["edges"]["nodes"]):
        adj[u].append((e, v, True))
        adj[v].append((e, u, False))
    plan = (
        list(start)
        if start is not None
        else [min(range(len(r)), key=lambda s: (r[s], usage[i][s])) for i, r in enumerate(costs)]
    )
    for _ in range(sweeps):
        moved = False
        for i, row in enumerate(costs):
            local = list(row)
            for e, j, is_row in adj[i]:
                m = p["edges"]["costs"][e]
                for s in range(width[i]):
                    local[s] += m[s * width[j] + plan[j]] if is_row else m[plan[j] * width[i] + s]
            best = min(range(width[i]), key=lambda s: (local[s], usage[i][s]))
            if (local[best], usage[i][best]) < (local[plan[i]], usage[i][plan[i]]):
                plan[i], moved = best, True
        if not moved:
            break
    return plan


def is_trivial(q, base_choice, share_of_source, slack=0.05, small=0.01):
    """Whether a subgraph tests nothing (solver independent: derived files must not change
    with the solver). Some plan that fits its memory limit (the base plan's choice on it, or
    a greedy plan from each node's cheapest strategy or from that choice) either costs within
    `slack` of the independent bound, so the optimum is squeezed between the two, or costs
    less than `small` x the subgraph's share of the source's cost (`share_of_source`: the
    base plan's whole cost x the subgraph's share of the nodes), so nothing on it is at stake.
    Without this, the BFS-drawn subgraphs of A, C, P and S had optima of 0 to 3,164 where
    their sources cost 1e9 to 1e11."""
    bound = independent_bound(q)
    for plan in (base_choice, greedy_plan(q), greedy_plan(q, base_choice)):
        cost, _ = evaluate(q, plan)
        if cost is not None and (cost <= (1 + slack) * bound or cost < small * share_of_source):
            return True
    return False


def fam_sub(p, size, rng, base, draws=50):
    """A connected subgraph of `size` nodes (BFS from a random node; restarted from a fresh
    node when a component runs out) whose memory limit is the base plan's peak on it.
    Trivial draws (is_trivial) are redrawn from the same random stream, so a first draw that
    tests something keeps the file (and its committed reference) it had before the filter."""
    n = len(p["nodes"]["costs"])
    if size >= n:
        return None, f"source has only {n} nodes"
    adj = [[] for _ in range(n)]
    for u, v in p["edges"]["nodes"]:
        adj[u].append(v)
        adj[v].append(u)
    whole_cost, _ = evaluate(p, base)
    for draw in range(draws):
        seen, order = set(), []
        while len(order) < size:
            start = rng.randrange(n)
            if start in seen:
                continue
            dq = deque([start])
            seen.add(start)
            while dq and len(order) < size:
                v = dq.popleft()
                order.append(v)
                for w in adj[v]:
                    if w not in seen:
                        seen.add(w)
                        dq.append(w)
        keep = sorted(order)
        q = restrict(p, keep)
        q["usage_limit"] = max(peak_usage(p, base, keep), 1)
        choice = [base[v] for v in keep]
        if not is_trivial(q, choice, whole_cost * size / n):
            break
    else:
        return None, f"every one of {draws} subgraphs was trivial (is_trivial)"
    redrawn = f", draw {draw + 1} (earlier ones trivial)" if draw else ""
    return (
        q,
        f"limit = base plan peak on the subgraph ({len(q['edges']['nodes'])} edges){redrawn}",
        choice,
    )


def fam_subset(p, frac, rng, base):
    S = {}
    for v, row in enumerate(p["nodes"]["costs"]):
        others = [s for s in range(len(row)) if s != base[v] and row[s] < INF]
        k = max(1, int(round(frac * len(row)))) - 1
        pick = sorted([base[v]] + rng.sample(others, min(k, len(others))))
        S[v] = pick
    q = restrict(p, list(range(len(p["nodes"]["costs"]))), S)
    q["usage_limit"] = p["usage_limit"]
    return q, f"keeps {frac:g} of the strategies, always the base plan's"


def fam_clone(p, k, rng, max_strats=32, sigma=0.05):
    """Adds up to k clones per node with <= max_strats strategies; a clone of strategy s gets
    s's usage and s's costs (node and every incident edge row/column) times small noise."""
    nodes = p["nodes"]
    S = []
    for row in nodes["costs"]:
        extra = [rng.randrange(len(row)) for _ in range(k)] if len(row) <= max_strats else []
        S.append(list(range(len(row))) + extra)
    costs = [
        [
            (
                nodes["costs"][v][s]
                if j < len(nodes["costs"][v])
                else noisy(nodes["costs"][v][s], rng, sigma)
            )
            for j, s in enumerate(S[v])
        ]
        for v in range(len(S))
    ]
    usages = [[nodes["usages"][v][s] for s in S[v]] for v in range(len(S))]
    ec = []
    for (u, v), m in zip(p["edges"]["nodes"], p["edges"]["costs"]):
        width, nu = len(nodes["costs"][v]), len(nodes["costs"][u])
        mat = []
        for a, sa in enumerate(S[u]):
            for b, sb in enumerate(S[v]):
                c = m[sa * width + sb]
                mat.append(noisy(c, rng, sigma) if (a >= nu or b >= width) else c)
        ec.append(mat)
    q = dict(p, nodes=dict(nodes, costs=costs, usages=usages), edges=dict(p["edges"], costs=ec))
    return q, f"up to {k} clones on nodes with <= {max_strats} strategies (noise sigma {sigma})"


def derived_limit(src_name, n_nodes, n_src):
    """Time limit for a derived instance: the source's contest limit, scaled down with the node
    count for subgraphs but never below 20 s (B and G, 816 nodes, have 60-120 s)."""
    full = INSTANCES[src_name][0]
    return max(20, round(full * n_nodes / n_src)) if n_nodes < n_src else full


def derive_one(cli, name, src, out, families, seed, manifest, base_dir):
    p = load(src)
    n_src = len(p["nodes"]["costs"])
    base = base_plan(cli, name, src, out, p, base_dir)
    for fam in families:
        # One independent stream per (source, family, seed): adding a family changes no other file.
        rng = random.Random(f"{seed}:{name}:{fam}")
        # The default seed keeps the short names; others say theirs (several seeds side by side).
        fname = f"{name}-{fam}.json.gz" if seed == 1 else f"{name}-{fam}-s{seed}.json.gz"
        if fam.startswith(SMALL_ONLY) and n_src > 5000:
            continue
        if fam.startswith("mem"):
            q, note = fam_mem(p, None if fam == "memmid" else float(fam[3:]), base)
        elif fam == "perturb":
            q, note = fam_perturb(p, rng)
        elif fam.startswith("sub") and not fam.startswith("subset"):
            res = fam_sub(p, int(fam[3:]), rng, base)
            q, note = res[0], res[1]
        elif fam.startswith("subset"):
            q, note = fam_subset(p, float(fam[6:]), rng, base)
        elif fam.startswith("clone"):
            q, note = fam_clone(p, int(fam[5:]), rng)
        else:
            sys.exit(f"unknown family {fam}")
        if q is None:
            print(f"skip {fname}: {note}")
            continue
        save(q, out / fname)
        n = len(q["nodes"]["costs"])
        manifest[fname] = {
            "source": name,
            "family": fam,
            "seed": seed,
            "nodes": n,
            "edges": len(q["edges"]["nodes"]),
            "max_strategies": max(len(r) for r in q["nodes"]["costs"]),
            "time_limit": derived_limit(name, n, n_src),
            "note": note,
        }
        print(f"wrote {fname}: {n} nodes, {note}", flush=True)


PLANNER_CASES = [
    # (file stem, demo options, plan mesh, dim names): tiny Llama-shaped models, so that the
    # strategy counts come from autoshard's own rules on 2-D and 3-D meshes. The 3-D ones have
    # ~300 strategies per node: 1.5 GB of JSON (mostly the 1e18 infeasible marker), which
    # `solve` takes ~5 s and 1.3 GB to read.
    ("llama2L-4x8", ["--layers", "2", "--mesh", "4x8", "--dim-names", "dp,tp"], "4x8", "dp,tp"),
    (
        "llama2L-2x2x2",
        ["--layers", "2", "--mesh", "2x2x2", "--dim-names", "dp,cp,tp"],
        "2x2x2",
        "dp,cp,tp",
    ),
    (
        "llama2L-2x4x4",
        ["--layers", "2", "--mesh", "2x4x4", "--dim-names", "dp,cp,tp"],
        "2x4x4",
        "dp,cp,tp",
    ),
]


def planner_problems(cli, out, manifest):
    """Traces the demo model (`autoshard demo --trace-only --graph-out`) and writes the solver
    problem of `autoshard plan --problem-out` for each mesh, gzipped (the 2x4x4 one is 1.5 GB
    as plain JSON). Cases whose file exists are kept as they are."""
    for stem, demo_opts, mesh, dims in PLANNER_CASES:
        gz = out / f"{stem}.json.gz"
        if gz.exists():
            continue
        graph = out / f"{stem}.graph.json"
        if not graph.exists():
            subprocess.run(
                ["autoshard", "demo", "--trace-only", "--graph-out", str(graph)] + demo_opts,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        prob = out / f"{stem}.json"
        r = subprocess.run(
            cli
            + [
                "plan",
                str(graph),
                "--mesh",
                mesh,
                "--dim-names",
                dims,
                "--time-limit",
                "60",
                "--problem-out",
                str(prob),
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0 or not prob.exists():
            print(f"skip {stem}: plan failed: {r.stderr.strip()[-300:]}")
            continue
        (out / f"{stem}.plan.txt").write_text(
            r.stdout + r.stderr
        )  # the planner's own result, to compare
        with open(prob, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        prob.unlink()
        p = load(gz)
        manifest[gz.name] = {
            "source": "planner",
            "family": stem,
            "seed": 0,
            "nodes": len(p["nodes"]["costs"]),
            "edges": len(p["edges"]["nodes"]),
            "max_strategies": max(len(r) for r in p["nodes"]["costs"]),
            "time_limit": 60,
            "note": f"autoshard demo {' '.join(demo_opts)}, mesh {mesh}, "
            f"{sum(len(r) for r in p['nodes']['costs']) / len(p['nodes']['costs']):.0f} strategies/node",
        }
        del p
        print(
            f"wrote {gz.name}: {manifest[gz.name]['nodes']} nodes, {manifest[gz.name]['note']}",
            flush=True,
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        default="B,G,A,C,L,S,P",
        help="source instances (default all seven; P, 65k nodes, stands in for the unseen "
        "60k-node graphs: Gemma-2 27B, Diffusion)",
    )
    ap.add_argument(
        "--families", default=DEFAULT_FAMILIES, help=f"comma list (default {DEFAULT_FAMILIES})"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="folder with the public instances")
    ap.add_argument("--cli", help="autoshard-cli path (default as bench/iopddl.py)")
    ap.add_argument(
        "--planner", action="store_true", help="also write autoshard's own planner problems"
    )
    ap.add_argument(
        "--fresh-base",
        action="store_true",
        help=f"derive from new solver plans (OUT/base/) instead of {BASE_DIR.relative_to(REPO)}/",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cli = find_cli(args.cli)
    mpath = out / "manifest.json"
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {}
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    for name in [s.strip() for s in args.only.split(",") if s.strip()]:
        derive_one(
            cli,
            name,
            Path(args.dir) / f"{name}.json.gz",
            out,
            families,
            args.seed,
            manifest,
            None if args.fresh_base else BASE_DIR,
        )
        mpath.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    if args.planner:
        planner_problems(cli, out, manifest)
        mpath.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
