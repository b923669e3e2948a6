#!/usr/bin/env python3
"""Independent optimum for small derived instances: the problem as an ILP solved by HiGHS.

Checks the solver's own "proven optimal" claims with a different method (issue 12). Model:
  x[i,s] binary, one per node (sum_s x[i,s] = 1); strategies with an infeasible cost get none.
  y[e,a,b] >= 0 per edge pair with a finite cost, tied to x by its marginals
    sum_b y[e,a,b] = x[u,a],  sum_a y[e,a,b] = x[v,b]
  which forces y to the one chosen pair when x is integral (a missing pair is forbidden).
  Edges whose matrix is r[a] + c[b] are folded into node costs (no y at all).
  Memory: one row per time point where the live set is maximal (a start not followed by
  another start before the next end), usages taken above each node's minimum.
Budgets (planner problems) are not modelled: run it on IOPDDL-derived instances only.

    pip install highspy
    python3 bench/ilp_ref.py DIR/B-sub500.json.gz [--time-limit 120] [--refs]
"""

import argparse
import bisect
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derived import INF, REFS, evaluate, load_refs, merge_ref, read_problem, save_refs  # noqa: E402


def build(p):
    costs, usages, iv = p["nodes"]["costs"], p["nodes"]["usages"], p["nodes"]["intervals"]
    n = len(costs)
    obj, cols = [], {}  # objective per variable; (i, s) -> column of x
    node_cost = [list(map(float, r)) for r in costs]
    offset = 0.0
    edge_y = []  # (u, v, {(a, b): column}) for non-additive edges
    for (u, v), m in zip(p["edges"]["nodes"], p["edges"]["costs"]):
        M = np.array(m, dtype=np.float64).reshape(len(costs[u]), len(costs[v]))
        fin = M < INF
        if fin.all():
            # Additive matrix -> node costs: M[a,b] == M[a,0] + M[0,b] - M[0,0] everywhere.
            r, c = M[:, 0] - M[0, 0], M[0, :]
            if np.array_equal(M, r[:, None] + c[None, :]):
                for a in range(M.shape[0]):
                    node_cost[u][a] += r[a]
                for b in range(M.shape[1]):
                    node_cost[v][b] += c[b]
                continue
        edge_y.append((u, v, M, fin))
    for i in range(n):
        for s, c in enumerate(costs[i]):
            if c < INF:
                cols[(i, s)] = len(obj)
                obj.append(node_cost[i][s])
    nx = len(obj)
    rows = []  # (lower, upper, [(col, coef)])
    for i in range(n):
        rows.append((1, 1, [(cols[(i, s)], 1.0) for s in range(len(costs[i])) if (i, s) in cols]))
    for u, v, M, fin in edge_y:
        ycol = {}
        for a in range(M.shape[0]):
            if (u, a) not in cols:
                continue
            for b in range(M.shape[1]):
                if fin[a, b] and (v, b) in cols:
                    ycol[(a, b)] = len(obj)
                    obj.append(M[a, b])
        for a in range(M.shape[0]):
            if (u, a) in cols:
                rows.append(
                    (
                        0,
                        0,
                        [(cols[(u, a)], -1.0)]
                        + [(ycol[(a, b)], 1.0) for b in range(M.shape[1]) if (a, b) in ycol],
                    )
                )
        for b in range(M.shape[1]):
            if (v, b) in cols:
                rows.append(
                    (
                        0,
                        0,
                        [(cols[(v, b)], -1.0)]
                        + [(ycol[(a, b)], 1.0) for a in range(M.shape[0]) if (a, b) in ycol],
                    )
                )
    # Memory rows at the maximal live sets.
    starts = sorted({a for a, b in iv if a < b})
    ends = sorted(b for a, b in iv if a < b)
    base = [min(usages[i][s] for s in range(len(costs[i])) if (i, s) in cols) for i in range(n)]
    for k, t in enumerate(starts):
        nxt = starts[k + 1] if k + 1 < len(starts) else None
        j = bisect.bisect_right(ends, t)
        if nxt is not None and j < len(ends) and ends[j] > nxt:
            continue
        live = [i for i in range(n) if iv[i][0] <= t < iv[i][1]]
        cap = p["usage_limit"] - sum(base[i] for i in live)
        terms = [
            (cols[(i, s)], float(usages[i][s] - base[i]))
            for i in live
            for s in range(len(costs[i]))
            if (i, s) in cols and usages[i][s] > base[i]
        ]
        if terms:
            rows.append((-np.inf, float(cap), terms))
    return obj, nx, rows, cols, offset


def solve_ilp(p, time_limit):
    import highspy

    obj, nx, rows, cols, offset = build(p)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.5)  # integer costs: a gap under 1 is a proof
    h.setOptionValue("threads", 1)
    nv = len(obj)
    h.addVars(nv, np.zeros(nv), np.ones(nv))
    h.changeColsCost(nv, np.arange(nv, dtype=np.int32), np.array(obj))
    h.changeColsIntegrality(
        nx, np.arange(nx, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * nx)
    )
    lo = np.array([r[0] for r in rows], dtype=np.float64)
    up = np.array([r[1] for r in rows], dtype=np.float64)
    starts = np.cumsum([0] + [len(r[2]) for r in rows[:-1]]).astype(np.int32)
    idx = np.array([c for r in rows for c, _ in r[2]], dtype=np.int32)
    val = np.array([x for r in rows for _, x in r[2]], dtype=np.float64)
    h.addRows(len(rows), lo, up, len(idx), starts, idx, val)
    t0 = time.monotonic()
    h.run()
    wall = time.monotonic() - t0
    info = h.getInfo()
    status = h.modelStatusToString(h.getModelStatus())
    sol = None
    if info.primal_solution_status == 2:  # feasible point available
        x = h.getSolution().col_value
        sol = [0] * len(p["nodes"]["costs"])
        for (i, s), c in cols.items():
            if x[c] > 0.5:
                sol[i] = s
    return dict(
        status=status, sol=sol, lb=info.mip_dual_bound + offset, wall=wall, vars=nv, rows=len(rows)
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+")
    ap.add_argument("--time-limit", type=float, default=120)
    ap.add_argument(
        "--refs",
        nargs="?",
        const=str(REFS),
        help="references to improve (best cost, highest bound; default file %(const)s)",
    )
    args = ap.parse_args(argv)
    refs = load_refs(args.refs) if args.refs else {}
    for path in args.problems:
        p, dig = read_problem(path)
        r = solve_ilp(p, args.time_limit)
        cost, why = evaluate(p, r["sol"]) if r["sol"] is not None else (None, "no solution")
        lb = float(np.ceil(r["lb"] - 1e-6)) if np.isfinite(r["lb"]) else None
        print(
            f"{Path(path).name}: HiGHS {r['status']} cost {cost} lb {lb} ({r['wall']:.1f} s, "
            f"{r['vars']} vars, {r['rows']} rows){'' if why is None else ' ' + why}",
            flush=True,
        )
        if args.refs:
            kind = f"HiGHS {args.time_limit:g}s"
            merge_ref(refs, Path(path).name, dict(cost=cost, lb=lb), kind, dig)
    if args.refs:
        save_refs(refs, args.refs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
