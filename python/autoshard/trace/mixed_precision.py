"""Mixed precision as FSDP2's ``MixedPrecisionPolicy`` means it, traced into the joint graph.

Parameters stay stored in their own dtype (fp32, say); the traced step casts each floating
parameter to ``param_dtype`` where the forward reads it, floating forward inputs too
(``cast_forward_inputs``) and floating outputs to ``output_dtype``. The backward of each cast
brings the gradient back to the storage dtype. Two placement rules make the collectives
happen in the dtypes the policy names (AutoParallel does the same):

- a parameter is all-gathered AFTER its cast to ``param_dtype`` (the cheaper dtype): the
  edges from the parameter through single-user, single-input nodes to the cast carry no
  collective;
- when ``reduce_dtype`` is wider than ``param_dtype``, a gradient is reduced AFTER the cast
  back to the storage dtype: the cast and the single-input chain above it take their input
  in its producer's layout, so a Partial gradient reaches the cast unreduced.

Both are recorded as ``local_inputs`` on graph nodes (docs/formats.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.utils._pytree as pytree

_CAST_OPS = {torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default}


@dataclass(frozen=True)
class MixedPrecision:
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    output_dtype: torch.dtype | None
    cast_forward_inputs: bool


def canonical_policy(mp_policy: Any) -> MixedPrecision | None:
    """Accepts ``torch.distributed.fsdp.MixedPrecisionPolicy`` or anything with its fields;
    ``reduce_dtype`` defaults to ``param_dtype``, as in AutoParallel."""
    if mp_policy is None:
        return None
    if not hasattr(mp_policy, "param_dtype"):
        raise TypeError(
            f"autoshard: mp_policy must be a torch.distributed.fsdp."
            f"MixedPrecisionPolicy (param_dtype, reduce_dtype, output_dtype, "
            f"cast_forward_inputs), got {type(mp_policy).__name__}"
        )
    param_dtype = mp_policy.param_dtype
    if param_dtype is None:
        # nothing to cast: the parameters' own dtype is used everywhere
        return None
    if not isinstance(param_dtype, torch.dtype) or not param_dtype.is_floating_point:
        raise ValueError(
            f"autoshard: mp_policy.param_dtype must be a floating torch.dtype, "
            f"got {param_dtype!r}"
        )
    reduce_dtype = getattr(mp_policy, "reduce_dtype", None) or param_dtype
    output_dtype = getattr(mp_policy, "output_dtype", None)
    for name, dt in (("reduce_dtype", reduce_dtype), ("output_dtype", output_dtype)):
        if dt is not None and (not isinstance(dt, torch.dtype) or not dt.is_floating_point):
            raise ValueError(
                f"autoshard: mp_policy.{name} must be a floating torch.dtype or "
                f"None, got {dt!r}"
            )
    return MixedPrecision(
        param_dtype,
        reduce_dtype,
        output_dtype,
        bool(getattr(mp_policy, "cast_forward_inputs", True)),
    )


class CastingStep(nn.Module):
    """Wraps the (fake) model for tracing: the forward reads parameters cast to
    ``param_dtype``. The wrapped model's parameters are the same tensors, so names map back
    by identity."""

    def __init__(self, inner: nn.Module, mp: MixedPrecision):
        super().__init__()
        self.inner = inner
        self.mp = mp

    def forward(self, *args, **kwargs):
        mp = self.mp

        def cast(x, dtype):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
                return x.to(dtype)
            return x

        if mp.cast_forward_inputs:
            args, kwargs = pytree.tree_map(lambda x: cast(x, mp.param_dtype), (args, kwargs))
        cast_of: dict[int, torch.Tensor] = {}  # tied names share one cast
        params = {}
        for name, p in self.inner.named_parameters(remove_duplicate=False):
            if id(p) not in cast_of:
                cast_of[id(p)] = cast(p, mp.param_dtype)
            params[name] = cast_of[id(p)]
        out = torch.func.functional_call(self.inner, params, args, kwargs)
        if mp.output_dtype is not None:
            out = pytree.tree_map(lambda x: cast(x, mp.output_dtype), out)
        return out


def _single_tensor_input(node: fx.Node) -> fx.Node | None:
    ins = [a for a in node.all_input_nodes]
    return ins[0] if node.op == "call_function" and len(ins) == 1 else None


def _is_cast(node: fx.Node, src: torch.dtype | None, dst: torch.dtype) -> bool:
    if node.op != "call_function" or node.target not in _CAST_OPS:
        return False
    val, arg = node.meta.get("val"), _single_tensor_input(node)
    if not isinstance(val, torch.Tensor) or val.dtype != dst or arg is None:
        return False
    a = arg.meta.get("val")
    return isinstance(a, torch.Tensor) and (src is None or a.dtype == src) and a.dtype != dst


def collective_free_inputs(
    gm: fx.GraphModule,
    param_placeholders: list[str],
    grad_values: dict[str, fx.Node],
    mp: MixedPrecision,
) -> dict[str, list[int]]:
    """Node name -> positions of inputs that must arrive without a collective (see module
    docstring). ``grad_values``: parameter placeholder -> the node producing its gradient."""
    local: dict[str, list[int]] = {}
    nodes = {n.name: n for n in gm.graph.nodes}
    for ph in param_placeholders:
        # forward: parameter -> single-user, single-input chain -> cast to param_dtype
        chain, node = [], nodes[ph]
        while len(node.users) == 1:
            user = next(iter(node.users))
            if _single_tensor_input(user) is not node:
                break
            chain.append(user)
            if _is_cast(user, None, mp.param_dtype):
                for c in chain:
                    local[c.name] = [0]
                break
            node = user
    if mp.reduce_dtype.itemsize > mp.param_dtype.itemsize:
        for ph, grad in grad_values.items():
            # backward: the cast back from param_dtype nearest the gradient, then upward
            # through single-input nodes
            storage_dtype = nodes[ph].meta["val"].dtype
            chain, node, cast_at = [], grad, None
            while node.op == "call_function" and _single_tensor_input(node) is not None:
                if cast_at is None and _is_cast(node, mp.param_dtype, storage_dtype):
                    cast_at = len(chain)
                chain.append(node)
                node = _single_tensor_input(node)
            if cast_at is not None:
                for c in chain[cast_at:]:
                    local[c.name] = [0]
    return local
