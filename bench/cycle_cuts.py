#!/usr/bin/env python3
"""How much of the local-polytope LP's gap cycle inequalities close (issue 46, fourth round).

On the dense 4x4x4 problems the LP (and the search's TRW-S bound, which reaches it) is
half-integral: frustrated cycles, where every integral plan pays on some edge and the LP mixes
two labels per node and pays on none. A cycle inequality over binary projections of the
labels charges such a cycle. Here each node's projections are its single labels ("node i
takes strategy s", the marginal mu_i(s)), every label in the LP's support: the projection
graph has a node per (i, s) and, per problem edge (i, j), an edge per label pair, whose two
projections disagree with the probability D = mu_i(s) + mu_j(t) - 2 mu_ij(s, t) (linear in
the marginals). For any closed walk in that graph and any odd set F of its edges,

    sum over F of (1 - D)  +  sum over the rest of D  >=  1

holds for every integral plan (walking around, the projections would change value an odd
number of times otherwise). Separation: the shortest path from (v, even) to (v, odd) in the
doubled graph (an F edge flips the parity at cost 1 - D, another keeps it at cost D), from
every fractional projection; a path shorter than 1 is a violated inequality. The cuts go into
the LP, which is solved again, for a number of rounds.

    python3 bench/cycle_cuts.py /tmp/autoshard_derived/mesh3d-4x4x4-sub300-pinned.json.gz \\
        --optimum 8801733 --rounds 10

Prints, per round, the LP's value, the share of the gap to --optimum closed, the violated
cuts found and the fractional nodes. A diagnostic: numpy and scipy (HiGHS) only, no solver.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derived import load  # noqa: E402
from derived_dense import LocalLP  # noqa: E402

EPS = 1e-7


def marginals(lp: LocalLP, x, all_labels=False):
    """Node marginals {(i, s): mu} over the support (every label with `all_labels`), and per
    edge {(a, b): mu} over the support."""
    node = {key: max(x[c], 0.0) for key, c in lp.col.items() if all_labels or x[c] > EPS}
    edge = [{ab: x[c] for ab, c in pairs.items() if x[c] > EPS} for pairs in lp.edge_col]
    return node, edge


def separate(lp: LocalLP, x, max_cuts: int, all_labels=False):
    """Violated cycle inequalities of the LP solution x: a list of (walk, violation), a walk
    being [(edge k, s, t, flips)] with s, t the labels at the edge's two ends."""
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.csgraph import dijkstra

    node, edge = marginals(lp, x, all_labels)
    ends = lp.p["edges"]["nodes"]
    index = {key: k for k, key in enumerate(sorted(node))}
    n = len(index)
    labels = {}
    for i, s in node:
        labels.setdefault(i, []).append(s)
    # one arc per (x0, x1) pair of the doubled graph, the cheapest (a sparse matrix would sum
    # duplicates), which also names the inequality term the path takes there
    best = {}
    for k, (u, v) in enumerate(ends):
        for s in labels.get(u, ()):
            for t in labels.get(v, ()):
                d = node[u, s] + node[v, t] - 2 * edge[k].get((s, t), 0.0)
                d = min(max(d, 0.0), 1.0)
                a, b = index[u, s], index[v, t]
                for flips, w in ((False, d), (True, 1.0 - d)):
                    w += 1e-9  # no zero weights: the sparse graph would drop them
                    for pa in (0, 1):  # both directions, both parities
                        pb = pa ^ flips
                        for arc in ((a + pa * n, b + pb * n), (b + pa * n, a + pb * n)):
                            if arc not in best or w < best[arc][0]:
                                best[arc] = (w, (k, s, t, flips))
    r2, c2, w2 = zip(*((x0, x1, w) for (x0, x1), (w, _) in best.items()))
    graph = sp.csr_matrix((w2, (r2, c2)), shape=(2 * n, 2 * n))
    sources = [index[key] for key, mu in node.items() if EPS < mu < 1 - 1e-6]
    if not sources:
        return []
    dist, pred = dijkstra(graph, indices=sources, return_predecessors=True)
    found, seen = [], set()
    order = np.argsort([dist[k, src + n] for k, src in enumerate(sources)])
    for k in order:
        src = sources[k]
        length = dist[k, src + n]
        if length >= 1 - 1e-6 or len(found) >= max_cuts:
            break
        walk, at = [], src + n
        while at != src:
            prev = pred[k, at]
            walk.append(best[prev, at][1])
            at = prev
        key = frozenset((a[0], a[1], a[2], a[3]) for a in walk)
        if key not in seen:
            seen.add(key)
            found.append((walk, 1 - length))
    return found


def cut_row(lp: LocalLP, walk):
    """The walk's inequality as `row . x <= rhs` over the LP's columns."""
    ends = lp.p["edges"]["nodes"]
    row, rhs = {}, 0.0
    # sum_F (1 - D) + sum_rest D >= 1   <=>   sum_F D - sum_rest D <= |F| - 1
    for k, s, t, flips in walk:
        u, v = ends[k]
        sign = 1.0 if flips else -1.0
        rhs += 1.0 if flips else 0.0
        for c, w in ((lp.col[u, s], sign), (lp.col[v, t], sign)):
            row[c] = row.get(c, 0.0) + w
        pair = lp.edge_col[k].get((s, t))
        if pair is not None:
            row[pair] = row.get(pair, 0.0) - 2 * sign
    return row, rhs - 1.0


def cut_matrix(lp: LocalLP, cuts):
    """(a_ub, b_ub) of the cut rows (cut_row's), or (None, None) without cuts."""
    import numpy as np
    import scipy.sparse as sp

    if not cuts:
        return None, None
    ri = [k for k, (row, _) in enumerate(cuts) for _ in row]
    rj = [c for row, _ in cuts for c in row]
    rv = [w for row, _ in cuts for w in row.values()]
    a_ub = sp.csr_matrix((rv, (ri, rj)), shape=(len(cuts), len(lp.c)))
    return a_ub, np.array([rhs for _, rhs in cuts])


def main(argv=None) -> int:

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--optimum", type=float, help="the known optimum, for the gap closed")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cuts-per-round", type=int, default=500)
    ap.add_argument("--rows", action="store_true", help="with the memory rows")
    ap.add_argument(
        "--all-labels", action="store_true", help="projections of every label, not the support's"
    )
    args = ap.parse_args(argv)
    lp = LocalLP(load(args.problem), args.rows)
    cuts: list[tuple[dict, float]] = []
    first = None
    for r in range(args.rounds + 1):
        t0 = time.perf_counter()
        res = lp.solve(*cut_matrix(lp, cuts))
        if res.status != 0:
            print(f"round {r}: {res.message}")
            return 0
        first = res.fun if first is None else first
        closed = ""
        if args.optimum:
            closed = f", gap {args.optimum / res.fun - 1:.3%}, closed {(res.fun - first) / (args.optimum - first):.1%}"  # noqa: E501
        found = separate(lp, res.x, args.cuts_per_round, args.all_labels)
        frac = sum(lp.fractional_shape(res.x).values())
        print(
            f"round {r}: LP {res.fun:,.0f}{closed}; {frac} fractional nodes; "
            f"{len(found)} violated cuts (max {max((v for _, v in found), default=0):.3f}); "
            f"{len(cuts)} cuts in; {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        if not found:
            break
        cuts += [cut_row(lp, walk) for walk, _ in found]
    return 0


if __name__ == "__main__":
    sys.exit(main())
