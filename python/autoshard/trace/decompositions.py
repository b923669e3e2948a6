"""Decompositions applied while tracing: ops rewritten into ones the planner can shard
better (or at all), each exact up to floating-point rounding.

- ``addmm`` -> ``mm`` + ``add``: the matmul and the bias add get their own layouts;
- mean losses (nll, mse, smooth-l1, huber, binary cross-entropy) -> sum / count: shardable
  on the batch, only scalars reduced;
- BatchNorm (training, eval, backward) -> torch's own decompositions into reductions and
  elementwise ops, and ``var_mean`` -> mean and a sum of squared deviations: batch
  statistics become partial sums over a sharded batch (synchronised BatchNorm, as the
  single-device model computes them), instead of gathering the activations.
"""

from __future__ import annotations

import math

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten


def _addmm_as_mm_add(bias, mat1, mat2, *, beta=1, alpha=1):
    # Linear layers with bias trace to addmm; splitting it lets the planner shard the matmul
    # and the bias add independently (tensor parallelism needs mm's own rules).
    out = aten.mm.default(mat1, mat2)
    if alpha != 1:
        out = aten.mul.Tensor(out, alpha)
    if beta == 0:
        return out
    if beta != 1:
        bias = aten.mul.Tensor(bias, beta)
    return aten.add.Tensor(out, bias)


_REDUCTION_MEAN, _REDUCTION_SUM = 1, 2


def _nll_loss_mean_as_sum(self, target, weight, reduction, ignore_index):
    # A mean nll_loss cannot run batch-sharded exactly (ranks may ignore different numbers
    # of targets), so the planner would gather the [N, vocab] log-probs. As a sum divided by
    # the total weight, the big op shards on the batch and only two scalars are reduced.
    if reduction != _REDUCTION_MEAN:
        return NotImplemented  # traced as is
    total, total_weight = aten.nll_loss_forward.default(
        self, target, weight, _REDUCTION_SUM, ignore_index
    )
    return aten.div.Tensor(total, total_weight), total_weight


def _nll_loss_backward_mean_as_sum(
    grad_output, self, target, weight, reduction, ignore_index, total_weight
):
    if reduction != _REDUCTION_MEAN:
        return NotImplemented  # traced as is
    scaled = aten.div.Tensor(grad_output, total_weight)
    return aten.nll_loss_backward.default(
        scaled, self, target, weight, _REDUCTION_SUM, ignore_index, total_weight
    )


def _elementwise_loss_mean_as_sum(op, reduction_at: int, backward: bool):
    """A mean elementwise loss (mse, smooth-l1, huber, binary cross-entropy) as its sum divided
    by the element count. The backward kernel of a mean loss divides by the count of the
    tensor it is given, so on a shard it would divide by the LOCAL count: no sharded layout
    is exact and the planner would gather the activations. The sum form shards (forward:
    partial sums; backward: the scaled gradient is a replicated scalar)."""

    def decomposed(*args, **kwargs):
        args, kwargs = list(args), dict(kwargs)
        if "reduction" in kwargs:
            reduction = kwargs["reduction"]
        else:
            reduction = args[reduction_at] if len(args) > reduction_at else _REDUCTION_MEAN
        if reduction != _REDUCTION_MEAN:
            return NotImplemented  # traced as is
        if "reduction" in kwargs or len(args) <= reduction_at:
            kwargs["reduction"] = _REDUCTION_SUM
        else:
            args[reduction_at] = _REDUCTION_SUM
        if backward:  # (grad_output, self, target, ...): scale the incoming gradient
            count = args[1].numel()
            args[0] = aten.div.Tensor(args[0], count)
            return op(*args, **kwargs)
        return aten.div.Tensor(op(*args, **kwargs), args[0].numel())

    return decomposed


_MEAN_AS_SUM_LOSSES = [  # (op, position of reduction, backward)
    (aten.mse_loss.default, 2, False),
    (aten.mse_loss_backward.default, 3, True),
    (aten.smooth_l1_loss.default, 2, False),
    (aten.smooth_l1_loss_backward.default, 3, True),
    (aten.huber_loss.default, 2, False),
    (aten.huber_loss_backward.default, 3, True),
    (aten.binary_cross_entropy.default, 3, False),
    (aten.binary_cross_entropy_backward.default, 4, True),
]


def _var_mean_as_sums(x, dim=None, *, correction=None, keepdim=False):
    # torch's var_mean is one kernel reducing every listed dim, so a dim sharded by the plan
    # would have to be gathered first; the mean and the sum of squared deviations reduce as
    # partial values (two small all-reduces of the per-channel statistics).
    dims = list(range(x.dim())) if dim is None or len(dim) == 0 else [d % x.dim() for d in dim]
    count = math.prod(x.shape[d] for d in dims)
    mean = aten.mean.dim(x, dims, True)
    dev = aten.sub.Tensor(x, mean)
    squares = aten.sum.dim_IntList(aten.mul.Tensor(dev, dev), dims, keepdim)
    var = aten.div.Tensor(squares, count - (1 if correction is None else correction))
    return var, mean if keepdim else aten.squeeze.dims(mean, dims)


_BATCH_NORM_OPS = [
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_no_training.default,
    aten.native_batch_norm.default,
    aten.native_batch_norm_backward.default,
    aten._batch_norm_with_update.default,
    aten._batch_norm_with_update_functional.default,
    aten.batch_norm_backward.default,
]


def default_decompositions() -> dict:
    decomps = {
        aten.addmm.default: _addmm_as_mm_add,
        aten.nll_loss_forward.default: _nll_loss_mean_as_sum,
        aten.nll_loss_backward.default: _nll_loss_backward_mean_as_sum,
        aten.var_mean.correction: _var_mean_as_sums,
    }
    for op, at, backward in _MEAN_AS_SUM_LOSSES:
        decomps[op] = _elementwise_loss_mean_as_sum(op, at, backward)
    decomps.update(get_decompositions(_BATCH_NORM_OPS))
    return decomps
