#!/usr/bin/env python3
"""Small dense problems on 3-D meshes (issue 46): the shape of the contest's unseen
816-node, 29-strategy transformer inference problem on 2x4x4, which the derived B-* and G-*
families (2-D meshes) do not have.

Two kinds, both written into the derived folder (default /tmp/autoshard_derived) with their
manifest entries, so that `bench/derived.py` scores them and keeps their references:

  mesh3d-*   synthetic: the public B graph (816 nodes, 1,096 edges, its live intervals), each
             node given a tensor of rank 2 or 3 and the strategies of a 3-D mesh: every mesh
             axis maps to one tensor dim or replicates (27 strategies for rank 2, up to 29
             kept for rank 3; plus a contraction dim for matmul-like nodes). Node cost:
             compute over the shards, plus an all-reduce per axis on the contraction dim.
             Edge cost: the resharding between the producer's layout and the consumer's, per
             mesh axis (all-gather, all-to-all), over a bandwidth per axis; axes of one size
             get one bandwidth, so the mesh's equal axes make symmetric plans, as on a real
             2x4x4 or 4x4x4 mesh. Usage: bytes over the shards; the limit between the
             per-node minimum's peak and the cheapest plan's (tightness 0 to 1),
             or none that binds (-nomem).
  fwd*L-*    autoshard's own planner problems: a Llama-3-8B-shaped model of L layers traced
             forward-only (inference, eval mode), planned on 2x4x4 / 4x4x4 with
             `autoshard-cli plan --problem-out` (needs torch and the autoshard package;
             --planner).

    python3 bench/derived_dense.py                     # synthetic family -> /tmp/autoshard_derived
    python3 bench/derived_dense.py --planner --only fwd # planner problems only
    python3 bench/derived.py --only mesh3d,fwd --refs  # references
    python3 bench/derived.py --only mesh3d,fwd --time-scale 0.25 --extra=--threads --extra=2
    python3 bench/derived_dense.py --only mesh3d --diagnostic --pinned  # the ablations
    python3 bench/derived_dense.py --stats FILE...     # structure: slack, pinned, matrices
    python3 bench/derived_dense.py --lp FILE... [--lp-rows]  # the local-polytope LP (scipy)

Seeded: the same files on every run; generated files are never committed.
"""

import argparse
import gzip
import hashlib
import itertools
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derive_instances import peak_usage, restrict, save  # noqa: E402
from derived import load  # noqa: E402
from iopddl import DEFAULT_DIR, find_cli  # noqa: E402

DEFAULT_OUT = Path("/tmp/autoshard_derived")
# (name, mesh, bandwidth per axis, memory tightness, seed, edge cost factor, transpose share).
# An edge factor of 100 makes the plan's cost mostly resharding (inference on a 3-D mesh:
# little compute per node, every layout change a collective); the mesh's two 4-axes have one
# bandwidth, the 2- (or first 4-) axis a quarter of it.
SYNTHETIC = [
    ("mesh3d-2x4x4", (2, 4, 4), (1.0, 4.0, 4.0), 0.5, 7, 100, 0.5),
    ("mesh3d-2x4x4-t0.1", (2, 4, 4), (1.0, 4.0, 4.0), 0.1, 8, 100, 0.5),
    ("mesh3d-2x4x4-c10", (2, 4, 4), (1.0, 4.0, 4.0), 0.5, 9, 10, 0.2),
    ("mesh3d-4x4x4", (4, 4, 4), (1.0, 4.0, 4.0), 0.5, 10, 100, 0.5),
    # mesh3d-2x4x4 with a limit no plan reaches: the same problem without its memory row
    ("mesh3d-2x4x4-nomem", (2, 4, 4), (1.0, 4.0, 4.0), None, 7, 100, 0.5),
    # a 300-node connected part of B's graph, small enough for the MILP to prove
    ("mesh3d-2x4x4-sub300", (2, 4, 4), (1.0, 4.0, 4.0), 0.5, 11, 100, 0.5, 300),
    # the same on 4x4x4, whose gap is the pairwise part's (transposes), not the limit's rows:
    # small enough for an exact reference, and to compare the search's bound with the LP's
    ("mesh3d-4x4x4-sub300", (4, 4, 4), (1.0, 4.0, 4.0), 0.5, 12, 100, 0.5, 300),
]
# Diagnostic variants (issue 46's measurements; docs/solver_dense.md), written only when named
# in --only or with --diagnostic: one factor of the model changed at a time. A tightness
# "xF" puts the limit at F times the least-usage peak (B's and G's own limits are 1.10x).
DIAGNOSTIC = [
    ("mesh3d-4x4x4-nomem", (4, 4, 4), (1.0, 4.0, 4.0), None, 10, 100, 0.5),
    ("mesh3d-4x4x4-tr0", (4, 4, 4), (1.0, 4.0, 4.0), 0.5, 10, 100, 0.0),
    ("mesh3d-4x4x4-tr0.1", (4, 4, 4), (1.0, 4.0, 4.0), 0.5, 10, 100, 0.1),
    ("mesh3d-4x4x4-tr0.2", (4, 4, 4), (1.0, 4.0, 4.0), 0.5, 10, 100, 0.2),
    ("mesh3d-4x4x4-bw124", (4, 4, 4), (1.0, 2.0, 4.0), 0.5, 10, 100, 0.5),
    ("mesh3d-4x4x4-x1.1", (4, 4, 4), (1.0, 4.0, 4.0), "x1.1", 10, 100, 0.5),
    ("mesh3d-2x4x4-tr0", (2, 4, 4), (1.0, 4.0, 4.0), 0.5, 7, 100, 0.0),
    ("mesh3d-2x4x4-x1.1", (2, 4, 4), (1.0, 4.0, 4.0), "x1.1", 7, 100, 0.5),
    ("mesh3d-2x4x4-x1.3", (2, 4, 4), (1.0, 4.0, 4.0), "x1.3", 7, 100, 0.5),
    ("mesh3d-4x8", (4, 8), (1.0, 4.0), 0.5, 10, 100, 0.5),
    ("mesh3d-2x4x4-ordered", (2, 4, 4), (1.0, 4.0, 4.0), 0.5, 7, 100, 0.5, None, True),
    ("mesh3d-4x4x4-ordered", (4, 4, 4), (1.0, 4.0, 4.0), 0.5, 10, 100, 0.5, None, True),
]
MAX_STRATEGIES = 29
# (file stem, layers, mesh, dim names): autoshard's own forward-only problems.
PLANNER = [
    ("fwd2L-2x4x4", 2, "2x4x4", "dp,cp,tp"),
    ("fwd2L-4x4x4", 2, "4x4x4", "dp,cp,tp"),
]
# Also known to the script, written only when named in --only: 797 nodes, ~2.4 GB of JSON,
# which derived.py's plan check reads into ~8 GB of Python objects.
PLANNER_BIG = [("fwd8L-2x4x4", 8, "2x4x4", "dp,cp,tp")]
REPO = Path(__file__).resolve().parents[1]
INFEASIBLE = 10**18  # the format's marker of a strategy that must not be taken

# Run by a fresh interpreter: traces the Llama-3-8B-shaped model forward-only (eval mode,
# tokens and labels, so the loss is in the graph) on a fake process group and writes the
# planner's graph JSON. An installed autoshard package is used; where it does not import
# (an editable install of another checkout), this checkout's python/ and the extension built
# in build/cp3*/.
TRACE = r"""
import glob, importlib.util, sys
layers, mesh, names, out, repo = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
try:
    import autoshard  # noqa: F401
except Exception:
    for k in [k for k in sys.modules if k.startswith("autoshard")]:
        del sys.modules[k]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, repo + "/python")
    so = sorted(glob.glob(repo + "/build/cp3*/_core*.so"))[-1]
    spec = importlib.util.spec_from_file_location("autoshard._core", so)
    core = importlib.util.module_from_spec(spec)
    sys.modules["autoshard._core"] = core
    spec.loader.exec_module(core)
import torch
from autoshard.models import Llama, llama3_8b_config
from autoshard.planning.graph_export import graph_json
from autoshard.trace.fake_pg import fake_world
from autoshard.trace.tracer import trace_training_step
shape = tuple(int(x) for x in mesh.split("x"))
seq, batch = 2048, 8 * shape[0]
with torch.device("meta"):
    model = Llama(llama3_8b_config(n_layers=layers, seq_len=seq))
def inputs():
    return torch.empty(batch, seq, dtype=torch.long), torch.empty(batch, seq, dtype=torch.long)
with fake_world(shape, tuple(names.split(","))) as m:
    step = trace_training_step(model, inputs, joint=False, training=False, extrapolate_layers=False)
    with open(out, "w") as f:
        f.write(graph_json(step, free_outputs=[], mesh=m))
"""


def layouts(rank, mesh, contraction):
    """Strategies of one node: per mesh axis, the tensor dim it shards (0..rank-1), the
    contraction dim (rank, when the node has one) or None (replicate)."""
    choices = list(range(rank + (1 if contraction else 0))) + [None]
    out = list(itertools.product(choices, repeat=len(mesh)))
    return out


def shards_of(layout, mesh, dim):
    n = 1
    for a, d in enumerate(layout):
        if d == dim:
            n *= mesh[a]
    return n


def all_shards(layout, mesh):
    n = 1
    for a, d in enumerate(layout):
        if d is not None:
            n *= mesh[a]
    return n


def bfs_subgraph(p, size, rng):
    """A connected part of `size` nodes (BFS from a seeded node), as its own problem."""
    n = len(p["nodes"]["costs"])
    adj = [[] for _ in range(n)]
    for u, v in p["edges"]["nodes"]:
        adj[u].append(v)
        adj[v].append(u)
    seen, order = set(), []
    while len(order) < size:
        start = rng.randrange(n)
        if start in seen:
            continue
        queue, head = [start], 0
        seen.add(start)
        while head < len(queue) and len(order) < size:
            v = queue[head]
            head += 1
            order.append(v)
            for w in adj[v]:
                if w not in seen:
                    seen.add(w)
                    queue.append(w)
    return restrict(p, sorted(order))


def synthetic(src, mesh, bw, tight, seed, comm=1.0, transpose=0.2, sub=None, ordered=False):
    """`ordered`: a node with more than MAX_STRATEGIES layouts keeps the same ones as every
    node of its rank and kind (the most sharded first) instead of a random subset, so that a
    consumer can take its producer's layout, as XLA's strategy sets mostly allow."""
    rng = random.Random(seed)
    p = load(src)
    if sub:
        p = bfs_subgraph(p, sub, rng)
    n = len(p["nodes"]["costs"])
    edges = p["edges"]["nodes"]
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    nodes = []
    for i in range(n):
        rank = 2 if rng.random() < 0.7 else 3
        contraction = rng.random() < 0.35
        sizes = [rng.choice([512, 1024, 2048, 4096, 8192]) for _ in range(rank)]
        elems = 1
        for s in sizes:
            elems *= s
        lay = layouts(rank, mesh, contraction)
        # A dim sharded by axes whose product exceeds its size is not a layout.
        lay = [l for l in lay if all(shards_of(l, mesh, d) <= sizes[d] for d in range(rank))]
        if len(lay) > MAX_STRATEGIES:
            keep = [tuple([None] * len(mesh))]  # replicated is always a strategy
            rest = [l for l in lay if l != keep[0]]
            rng.shuffle(rest)  # drawn either way: the other draws stay those of the seed
            if ordered:
                rest.sort(
                    key=lambda l: (
                        -sum(d is not None for d in l),
                        [-1 if d is None else d for d in l],
                    )
                )
            lay = keep + rest[: MAX_STRATEGIES - 1]
        lay.sort(key=lambda l: tuple(-1 if d is None else d for d in l))
        flops = elems * rng.choice([0, 0, 1, 64, 512]) / 1e6
        nodes.append(
            dict(rank=rank, sizes=sizes, elems=elems, lay=lay, flops=flops, contraction=contraction)
        )
    costs, usages = [], []
    for nd in nodes:
        cr, ur = [], []
        for l in nd["lay"]:
            sh = all_shards(l, mesh)
            c = nd["flops"] / sh
            # all-reduce of the output over every axis on the contraction dim
            for a, d in enumerate(l):
                if nd["contraction"] and d == nd["rank"]:
                    part = nd["elems"] / max(1, sh // mesh[a])
                    c += 2 * part * (mesh[a] - 1) / mesh[a] / bw[a] / 1e3
            cr.append(int(c))
            sh_out = 1
            for d in range(nd["rank"]):
                sh_out *= shards_of(l, mesh, d)
            ur.append(int(nd["elems"] * 2 / sh_out / 1e3))
        costs.append(cr)
        usages.append(ur)
    ecosts = []
    for u, v in edges:
        a, b = nodes[u], nodes[v]
        # consumer dim j reads producer dim dmap[j] (a transpose now and then), None if new
        dmap = list(range(b["rank"]))
        if rng.random() < transpose and b["rank"] >= 2:
            dmap[0], dmap[1] = dmap[1], dmap[0]
        dmap = [d if d < a["rank"] else None for d in dmap]
        inv = {d: j for j, d in enumerate(dmap) if d is not None}
        m = []
        for la in a["lay"]:
            # the producer's shard (its contraction axes are reduced away: replicated)
            out = tuple(d if d is not None and d < a["rank"] else None for d in la)
            held = a["elems"] / all_shards(out, mesh)
            for lb in b["lay"]:
                c = 0.0
                for ax in range(len(mesh)):
                    da = la[ax] if la[ax] is not None and la[ax] < a["rank"] else None
                    da = inv.get(da) if da is not None else None  # in consumer dims
                    db = lb[ax] if lb[ax] is not None and lb[ax] < b["rank"] else None
                    if da == db:
                        continue
                    k = mesh[ax]
                    if da is not None and db is None:  # all-gather
                        c += held * (k - 1) / bw[ax]
                    elif da is not None:  # all-to-all
                        c += held * (k - 1) / k / bw[ax]
                    # da None, db set: a local slice, free
                m.append(int(comm * c / 1e3))
        ecosts.append(m)
    q = {
        "nodes": {"intervals": p["nodes"]["intervals"], "costs": costs, "usages": usages},
        "edges": {"nodes": edges, "costs": ecosts},
        "usage_limit": None,
    }
    # limit: between the peak of the per-node minimum usages and the peak of the plan that
    # takes each node's cheapest strategy (tight=0: the minimum's peak; 1: no binding limit).
    # In this model a node's cheapest strategy is its most sharded one, which is also its
    # smallest, so both peaks are equal and every float tightness gives the least-usage peak
    # (measured: mesh3d-2x4x4, -t0.1, -c10 and 4x4x4 all have limit == that peak); "xF"
    # (F times that peak) is the knob that moves the limit.
    cheap = [min(range(len(c)), key=lambda s: (c[s], usages[i][s])) for i, c in enumerate(costs)]
    least = [min(range(len(u)), key=lambda s: u[s]) for u in usages]
    lo, hi = peak_usage(q, least), peak_usage(q, cheap)
    if tight is None:  # every plan fits
        most = [max(range(len(u)), key=lambda s: u[s]) for u in usages]
        q["usage_limit"] = peak_usage(q, most)
    elif isinstance(tight, str):  # "xF": F times the least-usage peak
        q["usage_limit"] = int(lo * float(tight[1:]))
    else:
        q["usage_limit"] = int(lo + tight * max(0, hi - lo))
    return q


def least_slack(p):
    """Per time point, the limit minus the summed least usages of the nodes live then."""
    iv, us = p["nodes"]["intervals"], p["nodes"]["usages"]
    end = max((b for a, b in iv), default=0)
    base = [0] * (end + 1)
    for (a, b), u in zip(iv, us):
        for t in range(a, b):
            base[t] += min(u)
    return [p["usage_limit"] - x for x in base[:end]]


def pinned(p):
    """The problem without its memory row, but with the strategies that row rules out alone
    made infeasible: those whose usage over the node's least exceeds the least slack over the
    node's interval (what the solver's reduction removes for memory). Solving it separates
    what the limit does by pinning nodes from what its rows do to the relaxation."""
    q = {
        "nodes": {
            k: [list(r) for r in v] if k != "intervals" else v for k, v in p["nodes"].items()
        },
        "edges": p["edges"],
        "usage_limit": None,
    }
    slack = least_slack(p)
    removed = 0
    for i, ((a, b), u) in enumerate(zip(p["nodes"]["intervals"], p["nodes"]["usages"])):
        if a >= b:
            continue
        room, least = min(slack[a:b]), min(u)
        for s, x in enumerate(u):
            if x - least > room:
                q["nodes"]["costs"][i][s] = INFEASIBLE
                removed += 1
    most = [max(range(len(u)), key=lambda s: u[s]) for u in p["nodes"]["usages"]]
    q["usage_limit"] = peak_usage(q, most)
    return q, removed


def structure(p):
    """What the measurements compare between B, G and the dense families (one line)."""
    costs, usages = p["nodes"]["costs"], p["nodes"]["usages"]
    n, edges, mats = len(costs), p["edges"]["nodes"], p["edges"]["costs"]
    deg, root = [0] * n, list(range(n))

    def find(x):
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
        root[find(u)] = find(v)
    cycles = len(edges) - n + len({find(i) for i in range(n)})  # independent cycles
    distinct = len({hashlib.sha1(repr(m).encode()).digest() for m in mats})
    # a matrix with a zero in every row: whatever the producer does, the consumer can follow
    # it for free (resharding only where the consumer prefers another layout)
    follow = nonzero = entries = 0
    for (u, v), m in zip(edges, mats):
        k = len(costs[v])
        follow += all(min(m[r * k : (r + 1) * k]) == 0 for r in range(len(costs[u])))
        nonzero += sum(1 for x in m if 0 < x < INFEASIBLE)
        entries += len(m)
    least = [min(range(len(u)), key=lambda s: u[s]) for u in usages]
    lo = peak_usage(p, least)
    lim = p["usage_limit"]
    if lim is None or lim < 0 or lo <= 0:  # no limit: nothing about memory to compare
        return f"nodes {n} edges {len(edges)} matrices distinct {distinct}"
    slack = sorted(least_slack(p))
    q = lambda f: slack[int(f * (len(slack) - 1))] / lim  # noqa: E731
    return (
        f"nodes {n} edges {len(edges)} cycles {cycles} "
        f"S avg {sum(map(len, costs)) / n:.1f} deg avg {2 * len(edges) / n:.2f} max {max(deg)} "
        f"matrices distinct {distinct} follow-free {follow / len(edges):.2f} "
        f"nonzero {nonzero / entries:.2f} | limit / least peak {lim / lo:.3f} "
        f"slack/limit p10 {q(0.1):.3f} p50 {q(0.5):.3f} | pinned {pinned(p)[1]}"
    )


class LocalLP:
    """The local-polytope LP of a problem (node and edge marginals; with `rows`, one memory
    row per maximal live set above each node's least usage), as scipy arrays: `col[i, s]` is
    node i's strategy s, `edge_col[k][a, b]` edge k's pair (a, b), finite entries only."""

    def __init__(self, p, rows=False):
        import numpy as np  # only the LP diagnostics need numpy and scipy
        import scipy.sparse as sp

        costs = p["nodes"]["costs"]
        self.p, self.col, self.edge_col, c = p, {}, [], []
        for i, r in enumerate(costs):
            for s, x in enumerate(r):
                if x < INFEASIBLE:
                    self.col[i, s] = len(c)
                    c.append(float(x))
        ri, rj, rv, rhs = [], [], [], []
        for i, r in enumerate(costs):  # one strategy per node
            for s in range(len(r)):
                if (i, s) in self.col:
                    ri.append(len(rhs))
                    rj.append(self.col[i, s])
                    rv.append(1.0)
            rhs.append(1.0)
        for (u, v), m in zip(p["edges"]["nodes"], p["edges"]["costs"]):
            su, sv, first, pairs = len(costs[u]), len(costs[v]), len(rhs), {}
            for a in range(su):  # the edge's marginals sum to its ends' choices
                for b in range(sv):
                    x = m[a * sv + b]
                    if (u, a) in self.col and (v, b) in self.col and x < INFEASIBLE:
                        ri += [first + a, first + su + b]
                        rj += [len(c), len(c)]
                        rv += [1.0, 1.0]
                        pairs[a, b] = len(c)
                        c.append(float(x))
            self.edge_col.append(pairs)
            for k, node, n in ((first, u, su), (first + su, v, sv)):
                for s in range(n):
                    if (node, s) in self.col:
                        ri.append(k + s)
                        rj.append(self.col[node, s])
                        rv.append(-1.0)
            rhs += [0.0] * (su + sv)
        self.c = np.array(c)
        self.a_eq = sp.csr_matrix((rv, (ri, rj)), shape=(len(rhs), len(c)))
        self.b_eq = np.array(rhs)
        self.a_ub = self.b_ub = None
        if rows and p["usage_limit"] is not None and p["usage_limit"] >= 0:
            self.a_ub, self.b_ub = self._memory_rows()

    def _memory_rows(self):
        import numpy as np
        import scipy.sparse as sp

        p, col = self.p, self.col
        costs, usages, iv = p["nodes"]["costs"], p["nodes"]["usages"], p["nodes"]["intervals"]
        live = [[] for _ in range(max(b for _, b in iv))]
        for i, (a, b) in enumerate(iv):
            for t in range(a, b):
                live[t].append(i)
        maximal = []
        for group in sorted({tuple(g) for g in live if g}, key=len, reverse=True):
            if not any(set(group) <= m for m in maximal):
                maximal.append(set(group))
        ui, uj, uv, ub = [], [], [], []
        for k, group in enumerate(maximal):  # usage above each node's least
            base = 0
            for i in group:
                least = min(usages[i][s] for s in range(len(costs[i])) if (i, s) in col)
                base += least
                for s in range(len(costs[i])):
                    if (i, s) in col and usages[i][s] > least:
                        ui.append(k)
                        uj.append(col[i, s])
                        uv.append(float(usages[i][s] - least))
            ub.append(float(p["usage_limit"] - base))
        return sp.csr_matrix((uv, (ui, uj)), shape=(len(ub), len(self.c))), np.array(ub)

    def solve(self, a_ub=None, b_ub=None, time_limit=300.0):
        """scipy's HiGHS on the LP, with `a_ub x <= b_ub` added to its own rows."""
        import numpy as np
        import scipy.sparse as sp
        from scipy.optimize import linprog

        if a_ub is not None and self.a_ub is not None:
            a_ub, b_ub = sp.vstack([self.a_ub, a_ub]), np.concatenate([self.b_ub, b_ub])
        elif a_ub is None:
            a_ub, b_ub = self.a_ub, self.b_ub
        return linprog(
            self.c, A_ub=a_ub, b_ub=b_ub, A_eq=self.a_eq, b_eq=self.b_eq, bounds=(0, None),
            method="highs", options={"time_limit": time_limit},
        )  # fmt: skip

    def fractional_shape(self, x):
        """The fractional nodes of solution x, counted by (support size, largest share)."""
        shape = {}
        for i, r in enumerate(self.p["nodes"]["costs"]):
            share = sorted((x[self.col[i, s]] for s in range(len(r)) if (i, s) in self.col))
            share.reverse()
            if share[0] < 0.999:
                key = (int(sum(v > 1e-6 for v in share)), round(float(share[0]), 2))
                shape[key] = shape.get(key, 0) + 1
        return shape


def local_lp(p, rows=False, time_limit=300.0):
    """The local-polytope LP of a problem (LocalLP), solved by scipy's HiGHS: the value the
    search's TRW-S bound can reach at best without the reduction. Returns (value or None,
    message, a count of the fractional nodes by (support size, largest share))."""
    lp = LocalLP(p, rows)
    res = lp.solve(time_limit=time_limit)
    if res.status != 0:
        return None, res.message, {}
    return float(res.fun), res.message, lp.fractional_shape(res.x)


def entry(p, family, seed, limit, note):
    return {
        "source": family.split("-")[0],
        "family": family,
        "seed": seed,
        "nodes": len(p["nodes"]["costs"]),
        "edges": len(p["edges"]["nodes"]),
        "max_strategies": max(len(r) for r in p["nodes"]["costs"]),
        "time_limit": limit,
        "note": note,
    }


def planner_problems(cli, out, manifest, limit, pats):
    """Traces and plans each PLANNER case whose file is missing; the problem is gzipped (the
    2-layer ones are ~0.6 GB of JSON, mostly the 1e18 infeasible marker)."""
    for stem, layers, mesh, dims in PLANNER + PLANNER_BIG:
        if not any(s in stem for s in pats) or (
            (stem, layers, mesh, dims) in PLANNER_BIG and stem not in pats
        ):
            continue
        gz = out / f"{stem}.json.gz"
        if gz.exists():
            continue
        graph = out / f"{stem}.graph.json"
        if not graph.exists():
            subprocess.run(
                [sys.executable, "-c", TRACE, str(layers), mesh, dims, str(graph), str(REPO)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        prob = out / f"{stem}.json"
        r = subprocess.run(
            cli
            + ["plan", str(graph), "--mesh", mesh, "--dim-names", dims, "--time-limit", "60"]
            + ["--problem-out", str(prob)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0 or not prob.exists():
            print(f"skip {stem}: plan failed: {r.stderr.strip()[-300:]}")
            continue
        (out / f"{stem}.plan.txt").write_text(r.stdout + r.stderr)
        with open(prob, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        prob.unlink()
        p = load(gz)
        avg = sum(len(r) for r in p["nodes"]["costs"]) / len(p["nodes"]["costs"])
        manifest[gz.name] = entry(
            p,
            stem,
            0,
            limit,
            f"Llama-3-8B shape, {layers} layers forward-only, mesh {mesh}, "
            f"{avg:.0f} strategies/node",
        )
        del p
        print(f"wrote {gz.name}: {manifest[gz.name]['note']}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="folder with the public instances")
    ap.add_argument("--only", default="mesh3d,fwd", help="comma list of name substrings")
    ap.add_argument("--limit", type=float, default=120, help="time limit written to the manifest")
    ap.add_argument("--planner", action="store_true", help="also the forward-only planner problems")
    ap.add_argument("--cli", help="autoshard-cli path (default as bench/iopddl.py)")
    ap.add_argument("--diagnostic", action="store_true", help="also the DIAGNOSTIC variants")
    ap.add_argument(
        "--pinned", action="store_true", help="also NAME-pinned: memory-pinned, limit lifted"
    )
    ap.add_argument("--stats", nargs="*", help="print the structure of these problem files")
    ap.add_argument("--lp", nargs="*", help="solve these problems' local-polytope LP (scipy)")
    ap.add_argument("--lp-rows", action="store_true", help="--lp: with the memory rows")
    args = ap.parse_args(argv)
    if args.lp is not None:
        for f in args.lp:
            value, message, shape = local_lp(load(f), args.lp_rows)
            top = sorted(shape.items(), key=lambda kv: -kv[1])[:4]
            print(
                f"{Path(f).name}: LP {value} ({message}); fractional nodes by (support, max): {top}"
            )
        return 0
    if args.stats is not None:
        for f in args.stats:
            print(f"{Path(f).name}: {structure(load(f))}", flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mpath = out / "manifest.json"
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {}
    pats = [s for s in args.only.split(",") if s]
    for name, mesh, bw, tight, seed, comm, tr, *more in SYNTHETIC + DIAGNOSTIC:
        diagnostic = name in [d[0] for d in DIAGNOSTIC]
        if not any(s in name for s in pats) or (
            diagnostic and not args.diagnostic and name not in pats
        ):
            continue
        q = synthetic(Path(args.dir) / "B.json.gz", mesh, bw, tight, seed, comm, tr, *more)
        fname = f"{name}.json.gz"
        save(q, out / fname)
        note = (
            f"B's graph, mesh {'x'.join(map(str, mesh))}, bandwidth {bw}, tightness {tight}, "
            f"edge factor {comm}, transposes {tr}"
            + (f", BFS part of {more[0]} nodes" if more and more[0] else "")
            + (", layouts kept by one order" if len(more) > 1 and more[1] else "")
        )
        manifest[fname] = entry(q, name, seed, args.limit, note)
        print(f"wrote {fname}: {manifest[fname]['nodes']} nodes, {note}", flush=True)
        if args.pinned and tight is not None:
            pq, removed = pinned(q)
            save(pq, out / f"{name}-pinned.json.gz")
            manifest[f"{name}-pinned.json.gz"] = entry(
                pq, f"{name}-pinned", seed, args.limit, f"{note}; {removed} strategies pinned"
            )
            print(f"wrote {name}-pinned.json.gz: {removed} strategies pinned", flush=True)
        mpath.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    if args.planner:
        planner_problems(find_cli(args.cli), out, manifest, 60, pats)
        mpath.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
