"""At most a given number of collectives in flight (issued, not yet waited for) at any point
of a graph, for backends whose collectives run on a small pool of host threads.

gloo runs a process group's collectives on 2 worker threads, and its all-gathers (every
``all_gather_into_tensor`` goes through gloo's coalesced all-gather) are not safe to run
side by side: a parameter bucket prefetched with the token and label gathers, four
all-gathers in flight, corrupted the heap once in a few hundred steps (issue 47; torch's
own test of async coalesced gathers on gloo was disabled as flaky for the same crash,
pytorch/pytorch#65231). With one in flight the same runs end cleanly. NCCL programs keep
their overlap: the pass runs only where waits block the host (pipeline.py)."""

from __future__ import annotations

import torch.fx as fx

from autoshard.program.graph_nodes import is_collective, is_wait


def limit_in_flight(gm: fx.GraphModule, limit: int = 1) -> int:
    """Before each collective is issued, the oldest ones still in flight are waited for,
    until fewer than ``limit`` are. Each collective still overlaps the compute between
    its issue and its wait; waiting earlier is always valid (a wait reads only its
    collective, issued before it). A wait of a graph input is of a collective issued
    before the graph started (late_loss_scale's held-back reduction): in flight from the
    start. Returns how many waits moved."""
    if limit < 1:
        raise ValueError(f"limit_in_flight: limit must be at least 1, got {limit}")
    pending = [
        n for n in gm.graph.nodes if is_wait(n) and getattr(n.args[0], "op", None) == "placeholder"
    ]
    moved = 0
    for n in list(gm.graph.nodes):
        if is_wait(n):
            if n in pending:
                pending.remove(n)
            continue
        if n.op != "call_function" or not is_collective(n):
            continue
        while len(pending) >= limit:
            n.prepend(pending.pop(0))
            moved += 1
        waits = [u for u in n.users if is_wait(u)]
        if waits:
            pending.append(waits[0])
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
