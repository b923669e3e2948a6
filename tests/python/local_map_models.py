"""A model made of ``autoshard.local_map`` regions, shared by tests/python/test_local_map.py
and its torchrun worker (tests/python/dist/local_map_worker.py).

``RegionNet(mesh)`` builds five regions on a mesh whose last dim is named "tp" (1-D
``("tp",)`` or 2-D ``("dp", "tp")``, the batch split over "dp"):

- ``matmul_allreduce``: x column-sharded, w1 row-sharded over "tp"; the local product is a
  partial sum, all-reduced inside the region: out Replicate on "tp";
- ``gate``: row-wise ``h * sigmoid(s) + tanh(h)`` with a replicated ``s`` whose gradient is
  a per-rank partial sum (in_grad_placements Partial);
- ``swap``: an all_to_all turning row shards into column shards (identity on values);
- ``matmul_scatter``: column-sharded x times row-sharded w3, the partial sums
  reduce-scattered over rows inside the region;
- ``gather``: an all_gather of the row shards (out Replicate on "tp").

``RegionNet(None)`` is the single-process reference: the same parameters and the same math
without regions.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.tensor import Partial, Replicate, Shard

import autoshard
from autoshard import collectives as C

DIM = 16


def _matmul_allreduce(x, w):
    return C.all_reduce(x @ w, "tp")


def _gate(h, s):
    return h * torch.sigmoid(s) + torch.tanh(h)


def _swap(h):
    # rows [b, D] on each "tp" rank -> columns [n*b, D/n]: block j of the columns goes to rank j
    n = C.axis_size("tp")
    b, d = h.shape
    blocks = h.reshape(b, n, d // n).permute(1, 0, 2).contiguous()  # [n, b, D/n]
    got = C.all_to_all(blocks.reshape(n * b, d // n), None, None, "tp")  # rank i's rows first
    return got


def _matmul_scatter(x, w):
    return C.reduce_scatter(x @ w, 0, "tp")


def _gather(h):
    return C.all_gather(h, 0, "tp")


def regions(mesh) -> dict:
    """The five regions for ``mesh`` (1-D: ("tp",); 2-D: ("dp", "tp"))."""
    two_d = mesh.ndim == 2
    S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()

    if two_d:  # the batch split over "dp" first
        rows, cols, rep = (S0, S0), (S0, S1), (S0, R)
        w_rows, w_rep, w_grad = (R, S0), (R, R), (P, S0)
        s_grad = (P, P)
    else:
        rows, cols, rep = (S0,), (S1,), (R,)
        w_rows, w_rep, w_grad = (S0,), (R,), (S0,)
        s_grad = (P,)
    lm = autoshard.local_map
    return {
        "matmul_allreduce": lm(
            _matmul_allreduce,
            out_placements=rep,
            in_placements=(cols, w_rows),
            in_grad_placements=(cols, w_grad),
            redistribute_inputs=True,
            device_mesh=mesh,
        ),
        "gate": lm(
            _gate,
            out_placements=rows,
            in_placements=(rows, w_rep),
            in_grad_placements=(rows, s_grad),
            redistribute_inputs=True,
            device_mesh=mesh,
        ),
        "swap": lm(
            _swap,
            out_placements=cols,
            in_placements=(rows,),
            redistribute_inputs=True,
            device_mesh=mesh,
        ),
        "matmul_scatter": lm(
            _matmul_scatter,
            out_placements=rows,
            in_placements=(cols, w_rows),
            in_grad_placements=(cols, w_grad),
            redistribute_inputs=True,
            device_mesh=mesh,
        ),
        "gather": lm(
            _gather,
            out_placements=rep,
            in_placements=(rows,),
            redistribute_inputs=True,
            device_mesh=mesh,
        ),
    }


class RegionNet(nn.Module):
    def __init__(self, mesh=None):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(DIM, DIM))
        self.s = nn.Parameter(torch.empty(DIM))
        self.w2 = nn.Parameter(torch.empty(DIM, DIM))
        self.w3 = nn.Parameter(torch.empty(DIM, DIM))
        self._regions = regions(mesh) if mesh is not None else None

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        r = self._regions
        if r is None:  # the single-process reference
            h = _gate(x @ self.w1, self.s) @ self.w2
            g = h @ self.w3
        else:
            h = r["gate"](r["matmul_allreduce"](x, self.w1), self.s) @ self.w2
            g = r["gather"](r["matmul_scatter"](r["swap"](h), self.w3))
        return ((g - target) ** 2).mean()


def init_reference(seed: int = 0) -> RegionNet:
    torch.manual_seed(seed)
    m = RegionNet()
    with torch.no_grad():
        for p in (m.w1, m.w2, m.w3):
            p.copy_(torch.randn(DIM, DIM) * 0.3)
        m.s.copy_(torch.randn(DIM) * 0.5)
    return m
