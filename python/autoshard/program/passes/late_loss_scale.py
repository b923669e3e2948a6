"""The loss's 1 / (global count of targets), applied at the end of the backward.

A mean loss over a batch sharded across ranks divides by the all-reduced count of targets
(fuse_reductions.count_targets_early issues that all-reduce at the top of the forward). The
backward starts with the same division: ``grad = tangent / count``, then nll_loss_backward
and everything after it. So the backward's first op needs the count, the forward saves it,
and the forward has to wait for the count's all-reduce before it returns: one point per
step where every rank waits for the slowest, which DDP (local means, divided by the world
size inside its gradient all-reduce) does not have. On 4 gloo ranks sharing 2 cores that
wait measured 0-14 ms a step (mean about 4).

The backward is linear in its tangent, so the division can move to the end: the backward
runs on the undivided tangent and each gradient it makes is divided by the count just
before it is returned, when the count's all-reduce has long completed. The forward saves
the count's all-reduce result without waiting for it; the backward waits for it at its
end (and the deferred loss, deferred_tail.py, at first use; the second wait is a no-op).

Numerics: the same values divided at another point, a rounding difference (about one unit
in the last place), not a change of what is computed. The rewrite is made only when it is
exact in real arithmetic, checked op by op: every op between the division and the
gradients is one of ``_LINEAR`` (linear in the argument the tangent flows through, the
others free of it), no other tangent path joins, and no float16 value (whose range an
undivided gradient could exceed) lies on the way. Otherwise the graphs stay as they are.

With nothing waiting for the count before the backward's end, program.lower_step also
all-reduces it together with the loss sum at the end of the forward (one scalar round trip
a step instead of two); the saved value is then taken out of that buffer, and the
backward takes it out the same way.

Only the graphs that run are rewritten (program.fwd / program.bwd, eager or compiled with
``compile=True``); parallel_gm and torch.compile of the module keep the traced ones, with
the division where the trace put it.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from autoshard.program.passes.fuse_reductions import SMALL_NUMEL
from autoshard.program.passes.overlap import only_carries
from autoshard.program.graph_nodes import is_collective, is_wait, op_name, tensor_val

# op -> positions of the arguments it is linear in (jointly); every other tensor argument
# must not depend on the tangent. ``None``: all tensor arguments (sums, concatenations).
_LINEAR: dict[str, tuple | None] = {
    **{
        v: (0,)
        for v in (
            "view",
            "_unsafe_view",
            "reshape",
            "expand",
            "t",
            "transpose",
            "permute",
            "squeeze",
            "unsqueeze",
            "clone",
            "contiguous",
            "alias",
            "detach",
            "_to_copy",
            "sum",
            "mean",
            "neg",
            "split",
            "split_with_sizes",
            "chunk",
            "slice",
            "select",
            "narrow",
            "unbind",
            "index_select",
            "repeat",
            "flip",
            "roll",
            "constant_pad_nd",
            "div",
            "zeros_like",
            # backward kernels: linear in the incoming gradient (argument 0)
            "embedding_dense_backward",
            "silu_backward",
            "gelu_backward",
            "threshold_backward",
            "sigmoid_backward",
            "tanh_backward",
            "_log_softmax_backward_data",
            "_softmax_backward_data",
            "native_layer_norm_backward",
            "nll_loss_backward",
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_cudnn_attention_backward",
            # sum-reducing collectives and their waits
            "all_reduce",
            "all_reduce_",
            "reduce_scatter_tensor",
            "all_gather_into_tensor",
            "all_to_all_single",
            "wait_tensor",
        )
    },
    **{v: (0, 1) for v in ("mul", "mm", "bmm", "matmul")},  # in one of the two, not both
    **{v: None for v in ("add", "sub", "cat", "stack")},  # in all of them
}
_COLLECTIVE_SUM_ONLY = {"all_reduce", "all_reduce_", "reduce_scatter_tensor"}


def scale_gradients_late(fwd: fx.GraphModule, bwd: fx.GraphModule, n_outputs: int) -> int:
    """Rewrite ``fwd`` / ``bwd`` (the eager program's graphs: forward outputs = module
    outputs then saved tensors; backward inputs = saved tensors then tangents) in place;
    returns how many counts now divide the gradients at the end (0 or 1)."""
    fwd_out = _output(fwd)
    slots = list(fwd_out.args[0])
    inputs = [n for n in bwd.graph.nodes if n.op == "placeholder"]
    n_saved = len(slots) - n_outputs
    tangents = inputs[n_saved:]
    for i, count in enumerate(inputs[:n_saved]):
        reduced = _saved_reduction(slots[n_outputs + i])
        if reduced is None:
            continue
        roots = _roots(count)
        if roots and _linear_from(bwd, roots, tangents):
            _rewrite(fwd, bwd, fwd_out, n_outputs + i, count, roots, *reduced)
            return 1
    return 0


def _output(gm: fx.GraphModule) -> fx.Node:
    return next(n for n in reversed(gm.graph.nodes) if n.op == "output")


def _saved_reduction(value) -> tuple[fx.Node, list[fx.Node]] | None:
    """(wait, carriers) when the saved ``value`` is one float element taken from the wait of
    a small sum all-reduce through carriers (views, splits: the count reduced alone, or
    together with the loss sum by fuse_reductions), else None."""
    v = tensor_val(value)
    if v is None or v.numel() != 1 or not v.dtype.is_floating_point:
        return None
    chain = []
    while not is_wait(value):
        if not only_carries(value) or len(value.all_input_nodes) != 1:
            return None
        chain.append(value)
        value = value.all_input_nodes[0]
    c = value.args[0]
    reduced = tensor_val(c)
    if not (
        is_collective(c)
        and op_name(c) in ("all_reduce", "all_reduce_")
        and c.args[1] == "sum"
        and reduced is not None
        and reduced.numel() <= SMALL_NUMEL
    ):
        return None
    return value, chain[::-1]


def _roots(count: fx.Node) -> list[fx.Node] | None:
    """The divisions ``tangent / count`` that start the backward, if every use of the saved
    count is one of them or nll_loss_backward's total weight under sum reduction (which
    ignores the value); else None."""
    roots = []
    for u in count.users:
        if (
            op_name(u) == "div"
            and len(u.args) == 2
            and u.args[1] is count
            and u.args[0] is not count
            and not u.kwargs
        ):
            roots.append(u)
        elif (
            op_name(u) == "nll_loss_backward"
            and u.args[6] is count
            and u.args[4] == 2
            and all(a is not count for a in u.args[:6])
        ):
            continue
        else:
            return None
    return roots or None


def _linear_from(bwd: fx.GraphModule, roots: list[fx.Node], tangents: list[fx.Node]) -> bool:
    """Every gradient the backward returns that depends on a tangent is a linear function of
    the roots' numerators alone, through the ops of ``_LINEAR``."""
    scaled = set(roots)  # values that carry the factor 1 / count
    other = set(tangents)  # tangent-dependent values that do not
    for n in bwd.graph.nodes:
        if n.op in ("placeholder", "output") or n in scaled:
            continue
        ins = n.all_input_nodes
        if not any(i in scaled or i in other for i in ins):
            continue
        if any(i in other for i in ins) or not _linear_op(n, scaled):
            if any(i in scaled for i in ins):
                return False  # the factor meets another tangent path, or a nonlinear op
            other.add(n)
            continue
        val = n.meta.get("val")
        if any(
            isinstance(v, torch.Tensor) and v.dtype == torch.float16
            for v in (val if isinstance(val, (tuple, list)) else [val])
        ):
            return False
        scaled.add(n)
    returned = [a for a in _output(bwd).args[0] if isinstance(a, fx.Node)]
    return not any(a in other for a in returned)


def _linear_op(n: fx.Node, scaled: set) -> bool:
    if n.target is operator.getitem:
        return True
    name = op_name(n)
    if name not in _LINEAR:
        return False
    if name in _COLLECTIVE_SUM_ONLY and n.args[1] != "sum":
        return False
    args = list(n.args) + list(n.kwargs.values())
    carrying = [k for k, a in enumerate(args) if isinstance(a, fx.Node) and a in scaled]
    linear_in = _LINEAR[name]
    if linear_in is None:  # add, sub, cat, stack: every tensor argument carries the factor
        summed = args[0] if name in ("cat", "stack") else args[:2]
        return all(isinstance(a, fx.Node) and a in scaled for a in summed)
    return len(carrying) == 1 and carrying[0] in linear_in


def _rewrite(
    fwd: fx.GraphModule,
    bwd: fx.GraphModule,
    fwd_out: fx.Node,
    slot: int,
    count: fx.Node,
    roots: list[fx.Node],
    wait: fx.Node,
    chain: list[fx.Node],
) -> None:
    aten = torch.ops.aten
    # forward: save the all-reduce's result, not its wait
    scalar_shape = list(tensor_val(fwd_out.args[0][slot]).shape)
    new = list(fwd_out.args[0])
    new[slot] = wait.args[0]
    fwd_out.args = (tuple(new) if isinstance(fwd_out.args[0], tuple) else new,)
    count.meta["val"] = wait.args[0].meta.get("val")
    # backward: undivided tangents; nll_loss_backward's ignored total weight: a stand-in that
    # does not read the count while it is in flight
    g = bwd.graph
    scaled = set(roots)
    for n in g.nodes:
        if n not in scaled and any(i in scaled for i in n.all_input_nodes):
            scaled.add(n)
    for u in list(count.users):
        if op_name(u) == "nll_loss_backward":
            with g.inserting_before(u):
                u.update_arg(6, g.call_function(aten.new_ones.default, (count, scalar_shape)))
    for r in roots:
        r.replace_all_uses_with(r.args[0])
        scaled.discard(r)
        g.erase_node(r)
    # each gradient divided where the least work does it: above the views and splits that
    # only carry it to the output (a gradient bucket's all-reduced buffer: one division for
    # the whole bucket instead of one per parameter)
    out = _output(bwd)
    order = {n: k for k, n in enumerate(g.nodes)}
    at = sorted(
        {
            _highest_view_source(a, scaled, out)
            for a in out.args[0]
            if isinstance(a, fx.Node) and a in scaled
        },
        key=order.__getitem__,
    )
    if not at:
        return
    with g.inserting_before(at[0].next):  # (inserting_after would reverse their order)
        # the count: waited for, and taken out of the reduced buffer as the forward did
        env = {wait: g.call_function(torch.ops._c10d_functional.wait_tensor.default, (count,))}
        for n in chain:
            env[n] = g.node_copy(n, env.__getitem__)
        total = env[chain[-1] if chain else wait]
    for m in at:
        with g.inserting_after(total if m is at[0] else m):
            divided = g.call_function(aten.div.Tensor, (m, total))
        m.replace_all_uses_with(divided, delete_user_cb=lambda u: u is not divided)
    for gm in (fwd, bwd):
        gm.graph.lint()
        gm.recompile()


def _highest_view_source(a: fx.Node, scaled: set, out: fx.Node) -> fx.Node:
    """The furthest node above gradient ``a``, through carriers, whose every use is a
    carrier chain ending in the output (dividing it divides only returned gradients)."""

    def only_carried_out(n: fx.Node) -> bool:
        return all(u is out or (only_carries(u) and only_carried_out(u)) for u in n.users)

    m = a
    while only_carries(m) and len(m.all_input_nodes) == 1:
        p = m.all_input_nodes[0]
        if p not in scaled or not only_carried_out(p):
            break
        m = p
    return m
