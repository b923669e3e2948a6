"""Custom ops with user sharding rules, shared by tests/python/test_user_rules.py and its
torchrun worker (tests/python/dist/user_rule_worker.py).

``mylib::rowscale(x, w)`` scales each row of ``x`` to unit RMS and then by ``w``: a row-wise
op, exact on row shards only (a shard of the last dim would see part of each row's sum of
squares). Its backward is a second custom op returning (grad_x, grad_w): grad_w sums over the
rows, so row shards give a Partial(sum) grad_w. The forward rule is registered through
``autoshard.register_sharding``, the backward one through torch's own decorator: both must be
honoured.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding as torch_register_sharding

import autoshard

EPS = 1e-6


@torch.library.custom_op("mylib::rowscale", mutates_args=())
def rowscale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w


@rowscale.register_fake
def _(x, w):
    return torch.empty_like(x)


@torch.library.custom_op("mylib::rowscale_backward", mutates_args=())
def rowscale_backward(
    grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r = torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)
    xhat = x * r
    gxhat = grad * w
    gx = r * (gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True))
    gw = (grad * xhat).reshape(-1, w.shape[0]).sum(0)
    return gx, gw


@rowscale_backward.register_fake
def _(grad, x, w):
    return torch.empty_like(x), torch.empty_like(w)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    return rowscale_backward(grad, x, w)


rowscale.register_autograd(_backward, setup_context=_setup)


@autoshard.register_sharding(torch.ops.mylib.rowscale.default)
def rowscale_rule(x, w):
    rows = [([Replicate()], [Replicate(), Replicate()])]
    for d in range(x.ndim - 1):  # any dim but the normalised last one
        rows.append(([Shard(d)], [Shard(d), Replicate()]))
    return rows


@torch_register_sharding(torch.ops.mylib.rowscale_backward.default)
def rowscale_backward_rule(grad, x, w):
    rows = [([Replicate(), Replicate()], [Replicate(), Replicate(), Replicate()])]
    for d in range(x.ndim - 1):
        rows.append(([Shard(d), Partial()], [Shard(d), Shard(d), Replicate()]))
    return rows


class RowScaleMLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = rowscale(self.w1(x), self.scale)
        return ((self.w2(h) - target) ** 2).sum()


def init_reference(seed: int = 0) -> RowScaleMLP:
    torch.manual_seed(seed)
    model = RowScaleMLP()
    with torch.no_grad():
        model.scale.uniform_(0.5, 1.5)  # not all ones: grad_w must really be reduced
    return model
