"""Fewer blocking round trips for small all-reduces in a lowered graph.

A mean loss over a batch split across ranks is planned either as the reduced sum divided by
the reduced count of targets, or as a Partial sum divided by the reduced count and reduced
afterwards. The lowered forward then holds two scalar all-reduces, in the second form one
waiting for the other:

    total = wait(all_reduce(count_local))          # round trip 1
    loss  = wait(all_reduce(sum_local / total))    # round trip 2, needs round trip 1

Each round trip is a point where every rank waits for the slowest (on gloo a few ms when
ranks share cores; a launch and a sync on GPUs). Two rewrites make them one:

1. ``split_normalised_reductions``: dividing by (or multiplying with) a replicated value
   is linear, so ``all_reduce(x / total)`` becomes ``all_reduce(x) / total``: the two
   all-reduces no longer depend on each other. The result is also closer to single-device
   numerics (one division of the whole sum instead of a sum of divided parts).
2. ``coalesce_small_reductions``: all-reduces of small tensors that follow one another in
   traced order, none of whose results is read before the last of them is issued, become
   one all-reduce of their concatenation, split back after its wait.

Before them, ``count_targets_early`` takes the count out of the round trip's critical
path: nll_loss's total weight (without class weights: the number of targets not ignored)
depends on the targets alone, so it is computed from them at the top of the graph and its
all-reduce issued there, hidden behind the whole forward. The loss sum's all-reduce is then
the only one at the end, and the forward does not wait for it (deferred_tail.py).

All keep every rank's collectives in the same order (they depend on the graph only).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from autoshard.program.passes.overlap import merge_collectives, propagate_meta
from autoshard.program.graph_nodes import (
    OUTSIDE,
    is_collective,
    is_wait,
    op_name,
    strip_views,
    tensor_val,
    wait_of,
)

# all-reduces at most this many elements are merged: for them the fixed cost of a round
# trip dominates (larger ones are gradient buckets, merged by overlap.bucket_reductions)
SMALL_NUMEL = 4096
_LINEAR_IN_FIRST = {"div"}  # op(x, total) is linear in x
_LINEAR_IN_EITHER = {"mul"}  # so is op(total, x)


def _sum_all_reduce(n: fx.Node) -> bool:
    return is_collective(n) and op_name(n) == "all_reduce" and n.args[1] == "sum"


def _reduced_scalar(t: fx.Node) -> fx.Node | None:
    """The all-reduce when ``t`` is the wait of a sum all-reduce of a one-element tensor."""
    if not is_wait(t) or not isinstance(t.args[0], fx.Node):
        return None
    c = t.args[0]
    v = tensor_val(c.args[0]) if _sum_all_reduce(c) else None
    return c if v is not None and v.numel() == 1 else None


def _linear_operand(d: fx.Node, group_args: tuple):
    """(x, total) when ``d`` is x divided or multiplied by an all-reduced scalar ``total``
    (a reduction over the same group), else None."""
    name = op_name(d)
    if name not in _LINEAR_IN_FIRST | _LINEAR_IN_EITHER or len(d.args) != 2 or d.kwargs:
        return None
    for xi in ([0] if name in _LINEAR_IN_FIRST else [0, 1]):
        x, total = d.args[xi], d.args[1 - xi]
        if not isinstance(x, fx.Node) or not isinstance(total, fx.Node):
            continue
        c1 = _reduced_scalar(total)
        if (
            c1 is not None
            and c1.args[1:] == group_args
            and tensor_val(x) is not None
            and tensor_val(x).dtype.is_floating_point
        ):
            return x, total
    return None


def count_targets_early(gm: fx.GraphModule) -> int:
    """For each nll_loss_forward without class weights whose total weight is all-reduced:
    the total weight recomputed from the targets right where they exist (the same count,
    exactly: whole numbers in the loss's float dtype) and its all-reduce moved there.
    Returns how many."""
    aten = torch.ops.aten
    g = gm.graph
    done = 0
    for n in [x for x in g.nodes if op_name(x) == "nll_loss_forward"]:
        target, weight, ignore = n.args[1], n.args[2], n.args[4]
        totals = [u for u in n.users if u.target is operator.getitem and u.args[1] == 1]
        src = tensor_val(n.args[0])
        if weight is not None or len(totals) != 1 or src is None or not isinstance(target, fx.Node):
            continue
        reductions = [u for u in totals[0].users if _sum_all_reduce(u)]
        if len(reductions) != 1:
            continue
        # the count over all elements does not depend on the targets' shape: counted on
        # the graph input the target is a view of, which exists from the start
        source = strip_views(target)
        with g.inserting_before(source.next):
            kept = g.call_function(aten.ne.Scalar, (source, ignore))
            count = g.call_function(aten.sum.default, (kept,))
            total = g.call_function(aten._to_copy.default, (count,), {"dtype": src.dtype})
        totals[0].replace_all_uses_with(total)
        g.erase_node(totals[0])
        total.append(reductions[0])  # issued as soon as the count exists
        done += 1
    return _finish(gm, done)


def split_normalised_reductions(gm: fx.GraphModule) -> int:
    """Rewrite 1 in place; returns how many all-reduces of a normalised value now reduce
    the value itself."""
    g = gm.graph
    done = 0
    for c2 in [n for n in g.nodes if _sum_all_reduce(n)]:
        w2, d = wait_of(c2), c2.args[0]
        if w2 is None or not isinstance(d, fx.Node) or len(d.users) != 1:
            continue
        found = _linear_operand(d, tuple(c2.args[1:]))
        if found is None:
            continue
        x, total = found
        with g.inserting_before(c2):
            coll = g.call_function(c2.target, (x, *c2.args[1:]))
            wait = g.call_function(w2.target, (coll,))
            result = g.call_function(d.target, tuple(wait if a is x else a for a in d.args))
        coll.meta["custom"] = dict(c2.meta.get("custom") or {})
        w2.replace_all_uses_with(result)
        for n in (w2, c2, d):
            g.erase_node(n)
        done += 1
    return _finish(gm, done)


def coalesce_small_reductions(
    gm: fx.GraphModule, small_numel: int = SMALL_NUMEL, hold_back: bool = False
) -> int:
    """Rewrite 2 in place; returns how many all-reduces were merged into others.
    ``hold_back``: merge also where large compute lies between two members (the earlier one
    then starts with the later: for a count nothing waits for until the backward's end,
    late_loss_scale.py)."""
    g = gm.graph
    merged = 0
    for run in _runs_of_small_reductions(gm, small_numel, hold_back):
        members = [(c.meta.get("custom") or {}).get("autoshard_node", OUTSIDE) for c, _ in run]
        coll = merge_collectives(g, run)
        coll.meta["custom"] = {
            "autoshard_node": "merged " + ", ".join(map(str, members)),
            "autoshard_members": members,
        }
        merged += len(run) - 1
    return _finish(gm, merged)


def _runs_of_small_reductions(
    gm: fx.GraphModule, small_numel: int, hold_back: bool = False
) -> list[list]:
    """Maximal runs (2 or more) of small sum all-reduces with the same group and dtype,
    consecutive among the graph's collectives, where no member's result is read before the
    run's last member is issued (so none depends on another), and no large tensor is
    computed between two members (their inputs exist at about the same time: one issued
    early, e.g. a count of targets, is not held back for one issued late)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    nodes = list(gm.graph.nodes)
    runs, cur = [], []

    def compute_between(a: fx.Node, b: fx.Node) -> bool:
        return not hold_back and any(
            tensor_val(x) is not None and tensor_val(x).numel() > small_numel
            for x in nodes[order[a] + 1 : order[b]]
        )

    def close():
        if len(cur) > 1:
            runs.append(list(cur))
        cur.clear()

    for c in [n for n in gm.graph.nodes if is_collective(n)]:
        w, v = wait_of(c), tensor_val(c.args[0])
        small = _sum_all_reduce(c) and w is not None and v is not None and v.numel() <= small_numel
        if not small:
            close()
            continue
        key = (tuple(c.args[1:]), v.dtype)
        read_early = any(order[u] < order[c] for _, pw, _ in cur for u in pw.users)
        if cur and (key != cur[0][2] or read_early or compute_between(cur[-1][0], c)):
            close()
        cur.append((c, w, key))
    close()
    return [[(c, w) for c, w, _ in run] for run in runs]


def _finish(gm: fx.GraphModule, changed: int) -> int:
    if changed:
        propagate_meta(gm)
        gm.graph.lint()
        gm.recompile()
    return changed
