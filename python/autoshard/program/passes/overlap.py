"""Overlapping communication with compute in a lowered graph.

DTensor issues each redistribution right before its consumer and waits at once, so nothing
overlaps. This pass reorders a local graph (program/lowering.py) so that every collective starts as
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

Before scheduling, ``bucket_reductions`` merges the gradient reductions that only feed the
graph's outputs (DDP's all-reduces, FSDP's reduce-scatters: one per parameter) into buckets
of up to ``bucket_bytes``, as DDP and FSDP do: one collective per bucket pays the fixed cost
of a call once, which dominates for the many small tensors (norm weights, biases).
"""

from __future__ import annotations

import itertools
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from autoshard.blocks import block_prefix
from autoshard.program.graph_nodes import OUTSIDE, PARAM_KEY, is_wait, op_name, wait_of

DEFAULT_PREFETCH_BYTES = 512 << 20
DEFAULT_BUCKET_BYTES = 25 << 20  # DDP's default bucket_cap_mb
FIRST_BUCKET_BYTES = 1 << 20  # DDP's first bucket: small, so reductions start early
SMALL_GROUP_BYTES = 1 << 20  # a block's collectives below this join the next block's
_PREFETCHED = {"all_gather_into_tensor", "all_to_all_single", "all_gather_into_tensor_coalesced"}


def _bytes(node: fx.Node) -> int:
    v = node.meta.get("val")
    vals = v if isinstance(v, (list, tuple)) else [v]
    return sum(int(t.numel()) * t.element_size() for t in vals if isinstance(t, torch.Tensor))


def _pairs(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """(collective, wait) pairs where the wait is the collective's only user."""
    return [(n, w) for n in gm.graph.nodes if (w := wait_of(n)) is not None]


def bucket_reductions(
    gm: fx.GraphModule, bucket_bytes: int | None = None, grad_of: list | None = None
) -> dict:
    """Merge terminal gradient reductions into buckets (in traced order, so every rank
    builds the same buckets). A bucket is issued where its last member was, its inputs
    flattened and concatenated; its result is split back just before the graph's output.
    ``grad_of[k]`` names the parameter whose gradient is output k: a bucket never spans two
    blocks (block_of), so a block's gradients are reduced while earlier blocks' backward
    runs (DDP's and FSDP2's overlap), not all at the end."""
    cap = DEFAULT_BUCKET_BYTES if bucket_bytes is None else int(bucket_bytes)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    out_args = (
        list(output.args[0]) if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    )
    keyed = []  # (op, group, dtype, block) of each terminal reduction, in traced order
    for c, w in _pairs(gm):
        name = op_name(c)
        if name not in ("all_reduce", "reduce_scatter_tensor"):
            continue
        tail = _view_tail(w, output)
        if tail is None:
            continue
        src = c.args[0].meta.get("val")
        if not isinstance(src, torch.Tensor):
            continue
        outs = [k for k, a in enumerate(out_args) if a is w or a in tail]
        param = grad_of[outs[0]] if grad_of and outs and outs[0] < len(grad_of) else None
        keyed.append(((name, *c.args[1:], src.dtype, block_of(param)), (c, w, tail)))
    groups = _join_small(_per_key_within_blocks(keyed), lambda m: _bytes(m[0].args[0]))
    buckets = []
    for members in groups:
        # with no blocks to overlap with, the graph's first bucket is a small one (DDP's
        # first bucket), so that some reduction starts before the whole backward is done
        buckets += _split(
            members,
            lambda m: _bytes(m[0].args[0]),
            lambda k: min(cap, FIRST_BUCKET_BYTES) if len(groups) == 1 and k == 0 else cap,
        )
    merged = [b for b in buckets if len(b) > 1]
    for bucket in merged:
        merge_collectives(gm.graph, [(c, w) for c, w, _ in bucket], split_before=output)
        # the views between each result and the output now follow the split
        for n in sorted({t for _, _, tail in bucket for t in tail}, key=_position(gm.graph)):
            output.prepend(n)
    return _finish(gm, merged)


def merge_collectives(g: fx.Graph, pairs: list, split_before: fx.Node | None = None) -> fx.Node:
    """One collective in place of the reductions ``pairs`` ((collective, wait), same op and
    group, in traced order): their inputs flattened and concatenated right after the last
    one is computed, the merged collective issued there, its result split back right after its wait (or just before ``split_before``) and
    each piece reshaped to what its old wait held; the old pairs are erased. Returns the new
    collective."""
    aten = torch.ops.aten
    last_c = pairs[-1][0]
    scatter = op_name(last_c) == "reduce_scatter_tensor"
    group_size = last_c.args[2] if scatter else 1
    # the flattening and concatenation go right after the last input is computed, so that
    # the scheduler can start the merged collective there (it moves collectives, not these)
    last_input = max((c.args[0] for c, _ in pairs), key=_position(g))
    with g.inserting_before(last_input.next):
        # a reduce-scatter splits dim 0 into group_size chunks: each member is laid out as
        # [group_size, -1] and the bucket concatenated on dim 1, so rank r's chunk of every
        # member lands in rank r's row
        flat_shape = [group_size, -1] if scatter else [-1]
        flats = [g.call_function(aten.reshape.default, (c.args[0], flat_shape)) for c, _ in pairs]
        cat = g.call_function(aten.cat.default, (flats, 1 if scatter else 0))
        coll = g.call_function(last_c.target, (cat, *last_c.args[1:]))
        wait = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (coll,))
    with g.inserting_before(split_before if split_before is not None else last_c):
        sizes = [int(c.args[0].meta["val"].numel()) // group_size for c, _ in pairs]
        split = g.call_function(aten.split_with_sizes.default, (wait, sizes, 1 if scatter else 0))
        pieces = []
        for k, (_, w) in enumerate(pairs):
            piece = g.call_function(operator.getitem, (split, k))
            pieces.append(
                (piece, g.call_function(aten.reshape.default, (piece, list(w.meta["val"].shape))))
            )
            w.replace_all_uses_with(pieces[-1][1])
    _label_bucket(
        coll,
        [c for c, _ in pairs],
        shared=[cat, split],
        per_member=[(flat, *piece) for flat, piece in zip(flats, pieces)],
    )
    _erase(g, pairs)
    return coll


# ops that only reshape, copy or slice a value (a partial gradient reduced whole and then
# sliced to the parameter's shard ends in split -> getitem -> clone)
_VIEW_OPS = {
    "t",
    "view",
    "reshape",
    "_unsafe_view",
    "transpose",
    "permute",
    "alias",
    "detach",
    "squeeze",
    "unsqueeze",
    "expand",
    "clone",
    "contiguous",
    "split",
    "split_with_sizes",
    "chunk",
    "slice",
    "narrow",
    "select",
}


def only_carries(n: fx.Node) -> bool:
    """``n`` reshapes, copies or slices its input, or takes one piece of a split: an
    elementwise op gives the same values before it as after it."""
    return n.target is operator.getitem or op_name(n) in _VIEW_OPS


def _view_tail(w: fx.Node, output: fx.Node) -> list | None:
    """The view-like ops between ``w`` and the graph output, when nothing else reads ``w``'s
    result (a gradient on its way out, e.g. transposed back); None otherwise."""
    tail, stack = [], list(w.users)
    while stack:
        u = stack.pop()
        if u is output:
            continue
        if not only_carries(u):
            return None
        if u not in tail:
            tail.append(u)
            stack.extend(u.users)
    return tail


def _position(g: fx.Graph):
    order = {n: i for i, n in enumerate(g.nodes)}
    return order.__getitem__


def bucket_gathers(gm: fx.GraphModule, bucket_bytes: int | None = None) -> dict:
    """Merge all-gathers of graph inputs (parameters' shards: FSDP's gathers) that follow
    one another in traced order into buckets of up to ``bucket_bytes`` of gathered output,
    as FSDP gathers a block's parameters in one call; a bucket never spans two blocks
    (block_of). Each bucket is gathered once, right before the first op reading any of its
    members, and split back there; the scheduler then starts it as early as the prefetch
    budget allows, and builds its input there (_build_input_at_issue)."""
    cap = DEFAULT_BUCKET_BYTES if bucket_bytes is None else int(bucket_bytes)
    aten = torch.ops.aten
    g = gm.graph
    position = _position(gm.graph)
    keyed = []  # (group, dtype, block) of each gather of a graph input, in traced order
    for c, w in _pairs(gm):
        src = c.args[0].meta.get("val")
        if (
            op_name(c) != "all_gather_into_tensor"
            or not _reads_an_input(c.args[0])
            or not isinstance(src, torch.Tensor)
        ):
            continue
        block = block_of(_input_source(c.args[0]).meta.get(PARAM_KEY))
        keyed.append(((*c.args[1:], src.dtype, block), (c, w)))
    merged = [
        b
        for run in _join_small(_runs(keyed), lambda m: _bytes(m[0]))
        for b in _split(run, lambda m: _bytes(m[0]), lambda k: cap)
        if len(b) > 1
    ]
    last_input = [n for n in g.nodes if n.op == "placeholder"][-1]
    _hoist_copy_chains(last_input, [c.args[0] for b in merged for c, _ in b])
    position = _position(gm.graph)
    for bucket in merged:
        first_use = min((u for _, w in bucket for u in w.users), key=position)
        c0 = bucket[0][0]
        group_size = c0.args[1]
        # the bucket's input is built as soon as its members exist (so the scheduler can
        # issue the gather early: prefetch), its result split where it is first needed
        ready = max([c.args[0] for c, _ in bucket] + [last_input], key=position)
        with g.inserting_before(ready.next):
            flats = [g.call_function(aten.reshape.default, (c.args[0], [-1])) for c, _ in bucket]
            cat = g.call_function(aten.cat.default, (flats, 0))
        with g.inserting_before(first_use):
            coll = g.call_function(c0.target, (cat, *c0.args[1:]))
            wait = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (coll,))
            rows = g.call_function(aten.reshape.default, (wait, [group_size, -1]))
            sizes = [int(c.args[0].meta["val"].numel()) for c, _ in bucket]
            split = g.call_function(aten.split_with_sizes.default, (rows, sizes, 1))
            helpers = []
            for k, (c, w) in enumerate(bucket):
                piece = g.call_function(operator.getitem, (split, k))
                shape = list(w.meta["val"].shape)
                if not _reshape_is_contiguous(group_size, sizes, k, shape):
                    # a member of one row (dim 0 of 1: the reshape is a strided view, which
                    # a later view of the gathered value cannot take): copy it contiguous
                    piece = g.call_function(
                        aten.clone.default, (piece,), {"memory_format": torch.contiguous_format}
                    )
                out = g.call_function(aten.reshape.default, (piece, shape))
                w.replace_all_uses_with(out)
                helpers.append((flats[k], piece, out))
        _label_bucket(coll, [c for c, _ in bucket], shared=[cat, rows, split], per_member=helpers)
        _erase(g, bucket)
    return _finish(gm, merged)


def _reshape_is_contiguous(group_size: int, sizes: list, k: int, shape: list) -> bool:
    """Whether member ``k``'s piece of a bucket's gathered rows ([group_size, sum(sizes)],
    split by ``sizes``) reshaped to ``shape`` is contiguous (a copy, or a view that is)."""
    rows = torch.empty(group_size, sum(sizes), device="meta")
    start = sum(sizes[:k])
    return rows[:, start : start + sizes[k]].reshape(shape).is_contiguous()


def block_of(fqn: str | None) -> str | None:
    """The repeated block a parameter belongs to: its name up to the first numeric part
    ("layers.3.attn.wq.weight" -> "layers.3"), "" for the model's other parameters, None
    when not a parameter. A bucket never spans two blocks: one bucket per block lets block
    k compute while block k+1's bucket is in flight (FSDP's per-block wrapping)."""
    if fqn is None:
        return None
    module = fqn.rpartition(".")[0]  # the parameter's own name is never the block index
    return block_prefix(module) or ""


# one-input ops that only re-lay or convert their input: DTensor gathers a transposed weight
# (x @ w.t() with w sharded) or a down-cast one (mixed precision) from such a copy, and pads
# a shorter uneven shard to the longest one's size before gathering it. The pad is traced
# only on the ranks whose shard is short (DTensor skips a pad of 0), so it must count as a
# copy: otherwise ranks with a pad would leave that gather out of a bucket that the others
# put it in, and the ranks' collectives would no longer match.
_COPY_OPS = {
    "t",
    "transpose",
    "permute",
    "clone",
    "contiguous",
    "_to_copy",
    "reshape",
    "view",
    "_unsafe_view",
    "alias",
    "detach",
    "constant_pad_nd",
    "pad",
}


def _input_source(n: fx.Node) -> fx.Node:
    """The node ``n`` is a view, transpose, copy or cast of (through any chain of them)."""
    while _copies(n):
        n = n.args[0]
    return n


def _copies(n: fx.Node) -> bool:
    """``n`` is one of _COPY_OPS of a tensor whose other arguments are known before the step
    runs (constants, or sizes computed from graph inputs: with symbolic shapes a pad's amount
    and a view's sizes are graph values, which _hoist_copy_chains moves up with it)."""
    if op_name(n) not in _COPY_OPS or not n.args or not isinstance(n.args[0], fx.Node):
        return False
    return all(_from_input_sizes(a) for a in _size_arguments(n))


def _size_arguments(n: fx.Node) -> list[fx.Node]:
    """The graph values among ``n``'s arguments other than its tensor input."""
    return [a for a in pytree.tree_leaves((n.args[1:], n.kwargs)) if isinstance(a, fx.Node)]


def _from_input_sizes(n: fx.Node, depth: int = 0) -> bool:
    """``n`` is a number computed from graph inputs alone (a size of an input, arithmetic on
    sizes): it exists, or can be computed, before the step's first op."""
    if n.op == "placeholder":
        return True
    if n.op != "call_function" or isinstance(n.meta.get("val"), torch.Tensor) or depth > 32:
        return False
    return all(_from_input_sizes(a, depth + 1) for a in n.all_input_nodes)


def _hoist_copy_chains(last_input: fx.Node, values: list[fx.Node]) -> None:
    """Move the views, transposes, copies, casts and pads that make each of ``values`` from a
    graph input to the top of the graph (right after the inputs), with the size computations
    they read, so that a bucket of gathers of such values can be issued at once rather than
    after the last member's copy, which the trace placed next to that member's use. They read
    graph inputs only, so any earlier place is valid; the copies are of local shards."""
    anchor, seen = last_input, set()

    def hoist(n: fx.Node) -> None:
        nonlocal anchor
        if n in seen or n.op == "placeholder":
            return
        for a in n.all_input_nodes:  # the copied value, then sizes computed from inputs
            hoist(a)
        seen.add(n)
        anchor.append(n)
        anchor = n

    for v in values:
        chain, n = [], v
        while n.op != "placeholder":
            chain.append(n)
            n = n.args[0]
        for n in reversed(chain):
            hoist(n)


def _reads_an_input(n: fx.Node) -> bool:
    """``n`` is a graph input (a parameter's local shard, a saved value) or a view, transpose,
    copy or cast of one: it exists before the step needs it, so its gather can be bucketed
    with the block's others (the cost model charges such gathers a share of a launch)."""
    return _input_source(n).op == "placeholder"


def _runs(keyed: list[tuple]) -> list[tuple]:
    """(key, members) of each run of consecutive (key, member) pairs with equal keys: a
    bucket only merges collectives that follow one another with the same key."""
    return [
        (key, [m for _, m in run]) for key, run in itertools.groupby(keyed, key=lambda km: km[0])
    ]


def _per_key_within_blocks(keyed: list[tuple]) -> list[tuple]:
    """Like _runs, but a block's reductions of different kinds may alternate (a weight's
    gradient all-reduced, the next norm scale's reduce-scattered): within each run of one
    block, the members of each key form one group, in traced order, so the alternation does
    not leave every small reduction a call of its own. Terminal reductions only feed the
    outputs, so issuing one later (with its group's last member) is always valid."""
    groups = []
    for run in itertools.groupby(keyed, key=lambda km: km[0][-1]):  # the block
        by_key: dict = {}
        for key, member in run[1]:
            by_key.setdefault(key, []).append(member)
        groups += by_key.items()
    return groups


def _join_small(groups: list[tuple], size_of) -> list[list]:
    """The members of each group ((key, members), key = (..., block)), where a group of
    fewer than SMALL_GROUP_BYTES joins the next group of the same kind (key with the block
    left out), so a small model's or a small block's collectives do not each pay a call's
    fixed cost: a few hundred microseconds on gloo, more than sending that little data."""
    out: list[tuple] = []
    for key, members in groups:
        if (
            out
            and out[-1][0] == key[:-1]
            and sum(size_of(m) for m in out[-1][1]) < SMALL_GROUP_BYTES
        ):
            out[-1] = (key[:-1], out[-1][1] + members)
        else:
            out.append((key[:-1], list(members)))
    return [members for _, members in out]


def _split(members: list, size_of, limit) -> list[list]:
    """``members`` cut, in order, into buckets whose sizes stay within ``limit(k)`` for the
    k-th bucket; a member larger than the limit is a bucket of its own."""
    buckets, cur, size = [], [], 0
    for m in members:
        b = size_of(m)
        if cur and size + b > limit(len(buckets)):
            buckets.append(cur)
            cur, size = [], 0
        cur.append(m)
        size += b
    if cur:
        buckets.append(cur)
    return buckets


def _label_bucket(
    coll: fx.Node, members: list[fx.Node], shared: list[fx.Node] = (), per_member: list[tuple] = ()
) -> None:
    """A bucket names the joint-graph nodes of the collectives it replaces; so do the ops
    it adds around them (``shared``: the concatenation and split; ``per_member[k]``: the
    reshapes and pieces of member k, which name member k's node)."""
    label = {
        "autoshard_node": "bucket of "
        + ", ".join((c.meta.get("custom") or {}).get("autoshard_node", OUTSIDE) for c in members)
    }
    for n in (coll, *shared):
        n.meta["custom"] = dict(label)
    for c, ops in zip(members, per_member):
        for n in ops:
            n.meta["custom"] = dict(c.meta.get("custom") or {})


def _erase(g: fx.Graph, pairs) -> None:
    for c, w in pairs:
        g.erase_node(w)
        g.erase_node(c)


def _finish(gm: fx.GraphModule, merged: list[list]) -> dict:
    if merged:
        propagate_meta(gm)
    gm.graph.lint()
    gm.recompile()
    return {"buckets": len(merged), "merged": sum(len(b) for b in merged)}


def propagate_meta(gm: fx.GraphModule) -> None:
    """Fill meta["val"] of new nodes (fake tensors) so later passes can size them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
    FakeTensorProp(
        gm, mode or FakeTensorMode(allow_non_fake_inputs=True)
    ).propagate_dont_convert_inputs(*vals)


def _issue_before_waits(moved: list[fx.Node]) -> list[fx.Node]:
    """The collectives and waits of one gap (in traced order) with every collective issued
    before the waits that nothing in the gap needs first: a wait there blocks on a
    collective in flight, so issuing the next one behind it would leave it idle meanwhile
    (e.g. the last gradient bucket issued only after the previous bucket is done). A wait
    that a collective of the gap reads (a chained redistribution) still precedes it."""
    out: list[fx.Node] = []
    emitted: set = set()

    def emit(n: fx.Node) -> None:
        if n not in emitted:
            emitted.add(n)
            out.append(n)

    waits = [n for n in moved if is_wait(n)]
    for c in (n for n in moved if not is_wait(n)):
        for w in waits:
            if w in c.all_input_nodes:
                emit(w)
        emit(c)
    for w in waits:
        emit(w)
    return out


def schedule_collectives(gm: fx.GraphModule, prefetch_bytes: int | None = None) -> dict:
    """Reorder ``gm`` in place; returns what was done (for logs and tests)."""
    budget = DEFAULT_PREFETCH_BYTES if prefetch_bytes is None else int(prefetch_bytes)
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    pairs = _pairs(gm)
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
        if op_name(c) in _PREFETCHED:
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
        new_order += _issue_before_waits(sorted(at_gap.get(g, []), key=order.__getitem__))
        if g < end:
            new_order.append(compute[g])
    for n in new_order:
        if n.op != "placeholder":
            output.prepend(n)
    report["inputs_built_at_issue"] = sum(_build_input_at_issue(c) for c, _ in pairs)
    gm.graph.lint()
    gm.recompile()
    return report


def _build_input_at_issue(c: fx.Node) -> int:
    """Move what builds collective ``c``'s input from graph inputs alone (a gather bucket's
    casts, pads, flattening and concatenation: bucket_gathers hoists them to the top of the
    graph) to just before ``c``, where nothing else reads it: otherwise every bucket's
    buffer would be live from the step's start to its issue, about one more copy of the
    rank's parameter shards at the activation peak; this way one bucket's buffer is built
    at a time. Returns how many nodes moved."""
    if op_name(c) not in _PREFETCHED or not isinstance(c.args[0], fx.Node):
        return 0
    cone: list[fx.Node] = []  # the input's builders from graph inputs, users before producers
    stack = [c.args[0]]
    while stack:
        n = stack.pop()
        if n in cone or n.op != "call_function" or not _from_inputs(n):
            continue
        cone.append(n)
        stack.extend(n.all_input_nodes)
    movable: set = set()
    for n in sorted(cone, key=_position(c.graph), reverse=True):
        if all(u is c or u in movable for u in n.users):
            movable.add(n)
    for n in sorted(movable, key=_position(c.graph)):
        c.prepend(n)
    return len(movable)


def _from_inputs(n: fx.Node, depth: int = 0) -> bool:
    """``n`` is computed from graph inputs alone (through at most 64 ops)."""
    if n.op == "placeholder":
        return True
    if n.op != "call_function" or depth > 64 or is_wait(n):
        return False
    return all(_from_inputs(a, depth + 1) for a in n.all_input_nodes)
