"""Overlapping communication with compute in a lowered graph.

DTensor issues each redistribution right before its consumer and waits at once, so nothing
overlaps. This pass reorders a local graph (program.py) so that every collective starts as
soon as its input exists and its ``wait_tensor`` runs just before the first op that reads
the result; the compute ops keep their order.

Starting early costs memory for collectives whose output is a new full-size buffer: an
all-gather (FSDP's parameter gather) or all-to-all issued long before its use holds that
buffer the whole time. Those are prefetched only while the bytes of such outputs in flight
(issued, not yet needed) stay within ``prefetch_bytes`` - the knob FSDP exposes as its
prefetch depth; the earliest-needed collective gets the budget first. Reductions
(all-reduce, reduce-scatter) start at once: their input exists anyway and their output is
no larger.

Every rank must issue collectives on a process group in the same order, and uneven shards
can give ranks different numbers of compute ops, so issue order is kept equal to the traced
order of the collectives (which depends on the plan only): a collective never starts before
one traced before it.

A gap is the point right before compute op i (gap len(compute) is the end of the graph).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .program import is_collective, is_wait

DEFAULT_PREFETCH_BYTES = 512 << 20
_PREFETCHED = {"all_gather_into_tensor", "all_to_all_single",
               "all_gather_into_tensor_coalesced"}


def _bytes(node: fx.Node) -> int:
    v = node.meta.get("val")
    vals = v if isinstance(v, (list, tuple)) else [v]
    return sum(int(t.numel()) * t.element_size() for t in vals if isinstance(t, torch.Tensor))


def _op_name(node: fx.Node) -> str:
    return node.target._schema.name.split("::")[-1]


def schedule_collectives(gm: fx.GraphModule, prefetch_bytes: int | None = None) -> dict:
    """Reorder ``gm`` in place; returns what was done (for logs and tests)."""
    budget = DEFAULT_PREFETCH_BYTES if prefetch_bytes is None else int(prefetch_bytes)
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    pairs = []  # (collective, wait) with the wait the collective's only user
    for n in nodes:
        if is_collective(n) and len(n.users) == 1:
            w = next(iter(n.users))
            if is_wait(w):
                pairs.append((n, w))
    moved = {x for p in pairs for x in p}
    output = next(n for n in nodes if n.op == "output")
    compute = [n for n in nodes if n not in moved and n.op != "output"]
    pos = {n: i for i, n in enumerate(compute)}
    end = len(compute)

    issue_gap: dict = {}
    wait_gap: dict = {}

    def available(inp: fx.Node) -> int:
        if inp in pos:
            return pos[inp] + 1
        if inp in wait_gap:
            return wait_gap[inp]
        raise AssertionError(f"collective input {inp.name} has no position yet")

    def needed(user: fx.Node) -> int:
        if user is output:
            return end
        if user in pos:
            return pos[user]
        return -1  # read by another collective: waited right after it is issued

    # each wait just before the first op reading its result; a wait read by another
    # collective (a chained redistribution, e.g. over two mesh dims) is placed right after
    # its own collective, below
    for c, w in pairs:
        need = min((needed(u) for u in w.users), default=end)
        wait_gap[w] = need  # -1 fixed below, once the collective's issue gap is known
    in_flight = [0] * (end + 1)
    prev_issue = 0
    report = {"collectives": len(pairs), "prefetched": 0, "deferred_by_budget": 0}
    for c, w in pairs:  # traced order = issue order on every rank
        ready = max((available(i) for i in c.all_input_nodes), default=0)
        ready = max(ready, prev_issue)
        if wait_gap[w] < 0:  # chained: the reader needs it as soon as possible
            wait_gap[w] = ready
        wait_at = max(wait_gap[w], ready)
        wait_gap[w] = wait_at
        if _op_name(c) in _PREFETCHED:
            size = _bytes(c)
            p = wait_at
            while p > ready and in_flight[p - 1] + size <= budget:
                p -= 1
            for g in range(p, wait_at):
                in_flight[g] += size
            if p > ready:
                report["deferred_by_budget"] += 1
        else:
            p = ready
        if p < wait_at:
            report["prefetched"] += 1
        issue_gap[c] = p
        prev_issue = p

    # rebuild: per gap, moved nodes in traced order, then the compute op of that gap
    at_gap: dict[int, list] = {}
    for c, w in pairs:
        at_gap.setdefault(issue_gap[c], []).append(c)
        at_gap.setdefault(wait_gap[w], []).append(w)
    new_order = []
    for g in range(end + 1):
        new_order += sorted(at_gap.get(g, []), key=order.__getitem__)
        if g < end:
            new_order.append(compute[g])
    for n in new_order:
        if n.op != "placeholder":
            output.prepend(n)
    gm.graph.lint()
    gm.recompile()
    return report
