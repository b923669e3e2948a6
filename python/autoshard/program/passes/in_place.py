"""Collectives and divisions that write into a buffer the program owns instead of a copy of
it, where nothing else reads that buffer (eager programs; inductor does this itself)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from autoshard.program.graph_nodes import is_functional_c10d, is_wait, op_name, tensor_val


def reduce_in_place(gm: fx.GraphModule) -> int:
    """All-reduces of a buffer that nothing else reads (a bucket's concatenation, a matmul's
    partial sums) reduce that buffer in place: the functional all_reduce first copies its
    input, a pass over every reduced byte for nothing. A buffer qualifies when its producer
    returns new memory (no alias in its schema), it is contiguous, and the all-reduce is its
    only user. Returns how many were changed. (Inductor does this itself when compiling.)"""

    def qualifies(n: fx.Node) -> bool:
        if op_name(n) != "all_reduce" or not is_functional_c10d(n):
            return False
        src = n.args[0]
        val = tensor_val(src)
        return not (
            val is None
            or not val.is_contiguous()
            or len(src.users) != 1
            or op_name(src) is None
            or any(r.alias_info is not None for r in src.target._schema.returns)
        )

    return _retarget(gm, qualifies, torch.ops._c10d_functional.all_reduce_.default)


def divide_in_place(gm: fx.GraphModule) -> int:
    """A gradient bucket's reduced buffer divided by the count of targets (late_loss_scale)
    is divided in place when the division is the buffer's only reader: a new buffer would
    be one more allocation and pass over every reduced byte. Run after reduce_in_place,
    which makes the buffer the program's own. Returns how many were changed."""

    def qualifies(n: fx.Node) -> bool:
        if n.target is not torch.ops.aten.div.Tensor or not isinstance(n.args[0], fx.Node):
            return False
        buf = n.args[0]
        if not (
            is_wait(buf)
            and len(buf.users) == 1
            and isinstance(buf.args[0], fx.Node)
            and buf.args[0].target is torch.ops._c10d_functional.all_reduce_.default
        ):
            return False
        val, by = tensor_val(buf), n.args[1]
        by = tensor_val(by) if isinstance(by, fx.Node) else by
        # in place only when the quotient has the buffer's shape and dtype (late_loss_scale's
        # divisions carry no meta of their own: read their operands)
        return not (
            val is None
            or by is None
            or torch.result_type(val, by) != val.dtype
            or (isinstance(by, torch.Tensor) and by.dim() > 0)
        )

    return _retarget(gm, qualifies, torch.ops.aten.div_.Tensor)


def _retarget(gm: fx.GraphModule, qualifies: Callable[[fx.Node], bool], target) -> int:
    """Point every node that ``qualifies`` at ``target`` (its in-place form); how many."""
    changed = [n for n in gm.graph.nodes if qualifies(n)]
    for n in changed:
        n.target = target
    if changed:
        gm.recompile()
    return len(changed)
