"""Targeted graphs for the numeric rule validator (validate.py), one per op family added for
common Hugging Face models (issue 14), with real values. Each covers the variants a model
graph alone would not: every reduction of every loss, 1-D/2-D/3-D, strided, padded, grouped
and transposed convolutions with and without a bias or an input gradient, the four layouts of
torch._grouped_mm, histograms with and without a range.

    convolutions  convolution + convolution_backward (make_fx of autograd.grad)
    losses_raw    mse / smooth-l1 / huber / BCE / BCE-with-logits, reductions none, sum and
                  mean, forward and backward, as ATen dispatches them
    losses        the same model through the tracer's default decompositions (mean losses
                  as sum / count)
    histograms    histc (with and without a range; its counts summed to int32 offsets as
                  MoE routing does), bincount
    scatters      select_scatter, slice_scatter, fill.Tensor (T5's shift-right, a key built
                  from two halves)
    grouped_mm    torch._grouped_mm (2d x 3d, 2d x 2d, 3d x 2d, 3d x 3d; bfloat16) and
                  transformers' grouped_mm_fallback with its backward
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

CASES = ("convolutions", "losses_raw", "losses", "histograms", "scatters", "grouped_mm")

aten = torch.ops.aten


def _randn(gen: torch.Generator):
    return lambda *shape: torch.randn(*shape, generator=gen)


def convolutions(seed: int = 0):
    from autoshard._testing.capture import capture_function

    r = _randn(torch.Generator().manual_seed(seed))

    def f(x1, w1, b1, x2, w2, x3, w3, b3, xt, wt, xp, wp, bp, xg, wg, g1, g2, g3, gt, gp, gg):
        x1, w1, b1, x2, w2, x3, w3, b3, xt, wt, wp, bp, xg, wg = [
            t.detach().requires_grad_()
            for t in (x1, w1, b1, x2, w2, x3, w3, b3, xt, wt, wp, bp, xg, wg)
        ]
        outs = (
            F.conv1d(x1, w1, b1, stride=2, padding=1),
            F.conv2d(x2, w2, None, padding=1),
            F.conv3d(x3, w3, b3, stride=2),  # non-overlapping 2x2x2 windows
            F.conv_transpose2d(xt, wt, None, stride=2, padding=1, output_padding=1),
            F.conv2d(xp, wp, bp, stride=4),  # ViT-style patches, no input gradient
            F.conv2d(xg, wg, None, padding=1, groups=2),
        )
        grads = torch.autograd.grad(
            outs, (x1, w1, b1, x2, w2, x3, w3, b3, xt, wt, wp, bp, xg, wg), (g1, g2, g3, gt, gp, gg)
        )
        return outs + grads

    args = [
        r(4, 6, 12),
        r(8, 6, 3),
        r(8),  # conv1d
        r(4, 4, 8, 8),
        r(8, 4, 3, 3),  # conv2d, no bias
        r(2, 4, 8, 8, 8),
        r(8, 4, 2, 2, 2),
        r(8),  # conv3d
        r(2, 4, 6, 6),
        r(4, 6, 3, 3),  # conv_transpose2d
        r(4, 3, 16, 16),
        r(8, 3, 4, 4),
        r(8),  # patch embedding
        r(4, 4, 8, 8),
        r(8, 2, 3, 3),
    ]  # groups=2
    for shape in [
        (4, 8, 6),
        (4, 8, 8, 8),
        (2, 8, 4, 4, 4),
        (2, 6, 12, 12),
        (4, 8, 4, 4),
        (4, 8, 8, 8),
    ]:
        args.append(r(*shape))  # output gradients
    return capture_function("convolutions", f, *args)


class Losses(nn.Module):
    """Every elementwise loss with every reduction on two parameters (so their backwards are
    traced); ``none`` results are reduced against a random weight."""

    def __init__(self, gen: torch.Generator):
        super().__init__()
        self.x = nn.Parameter(torch.randn(4, 6, 8, generator=gen))
        self.p = nn.Parameter(torch.rand(4, 6, 8, generator=gen) * 0.9 + 0.05)

    def forward(self, t, q, w, pw, g):
        total = 0
        for red in ("none", "sum", "mean"):
            for out in (
                F.mse_loss(self.x, t, reduction=red),
                F.smooth_l1_loss(self.x, t, reduction=red, beta=0.5),
                F.huber_loss(self.x, t, reduction=red, delta=0.7),
                F.binary_cross_entropy_with_logits(
                    self.x, q, weight=w, pos_weight=pw, reduction=red
                ),
                F.binary_cross_entropy(self.p, q, weight=w, reduction=red),
            ):
                total = total + ((out * g).sum() if out.dim() else out)
        return total


def losses(seed: int = 0, raw: bool = False):
    from autoshard._testing.capture import capture_model

    gen = torch.Generator().manual_seed(seed + 1)
    model = Losses(gen)
    inputs = (
        torch.randn(4, 6, 8, generator=gen),
        torch.rand(4, 6, 8, generator=gen),
        torch.rand(8, generator=gen) + 0.5,
        torch.rand(8, generator=gen) + 0.5,
        torch.randn(4, 6, 8, generator=gen),
    )
    return capture_model(
        "losses_raw" if raw else "losses",
        model,
        inputs,
        seed=seed,
        decompositions={} if raw else None,
    )


def histograms(seed: int = 0):
    from autoshard._testing.capture import capture_function

    gen = torch.Generator().manual_seed(seed + 2)

    def f(ids, x, idx, weights):
        counts = torch.histc(ids, bins=4, min=0, max=3)  # tokens per expert
        return (
            counts,
            torch.cumsum(counts, 0, dtype=torch.int32),  # MoE group offsets
            torch.histc(x, bins=5),  # range from the data
            torch.histc(x, bins=6, min=-1, max=1),
            torch.bincount(idx, minlength=6),
            torch.bincount(idx, weights=weights),
        )

    return capture_function(
        "histograms",
        f,
        torch.randint(0, 4, (12, 2), generator=gen).float(),
        torch.randn(6, 4, generator=gen),
        torch.randint(0, 5, (12,), generator=gen),
        torch.rand(12, generator=gen),
    )


def scatters(seed: int = 0):
    from autoshard._testing.capture import capture_function

    gen = torch.Generator().manual_seed(seed + 3)
    r = _randn(gen)

    def f(ids, start_id, x, s, k, half):
        shifted = aten.slice_scatter.default(torch.zeros_like(ids), ids[:, :-1], 1, 1)
        first = aten.fill.Tensor(ids[:, 0], start_id)
        shifted = aten.select_scatter.default(shifted, first, 1, 0)
        y = aten.select_scatter.default(x, s, 2, 1)
        key = aten.slice_scatter.default(k, half, 3, 0, 4)
        key = aten.slice_scatter.default(key, half * 2, 3, 4)
        return shifted, y, key

    return capture_function(
        "scatters",
        f,
        torch.randint(0, 9, (4, 8), generator=gen),
        torch.tensor(7),
        r(4, 6, 3),
        r(4, 6),
        r(2, 4, 6, 8),
        r(2, 4, 6, 4),
    )


def grouped_mm(seed: int = 0):
    # registers transformers::grouped_mm_fallback (and its backward)
    import transformers.integrations.moe  # noqa: F401

    from autoshard._testing.capture import capture_function

    gen = torch.Generator().manual_seed(seed + 4)
    r = _randn(gen)
    bf = lambda *shape: r(*shape).to(torch.bfloat16)  # noqa: E731

    def f(a, w, offs, at, g, a3, b2, offs_n, b3, x, wf, gf):
        y23 = torch._grouped_mm(a, w, offs=offs)  # [M,K] x [G,K,N], rows grouped
        y22 = torch._grouped_mm(at, g, offs=offs)  # [K2,M] x [M,N], contraction grouped
        y32 = torch._grouped_mm(a3, b2, offs=offs_n)  # [G,M,K] x [K,N], columns grouped
        y33 = torch._grouped_mm(a3, b3)  # batched
        yf = torch.ops.transformers.grouped_mm_fallback(x, wf, offs)
        gi, gw = torch.ops.transformers.grouped_mm_fallback_backward(x, wf, offs, gf)
        return y23, y22, y32, y33, yf, gi, gw

    offs = torch.tensor([5, 5, 12, 16], dtype=torch.int32)  # with an empty group
    offs_n = torch.tensor([8, 16, 16, 32], dtype=torch.int32)
    return capture_function(
        "grouped_mm",
        f,
        bf(16, 32),
        bf(4, 32, 64),
        offs,
        bf(32, 16),
        bf(16, 64),
        bf(4, 8, 32),
        bf(32, 32),
        offs_n,
        bf(4, 32, 16),
        r(16, 24),
        r(4, 24, 8),
        r(16, 8),
    )


def capture(name: str, seed: int = 0):
    """The CapturedGraph of case ``name`` (one of CASES)."""
    if name == "losses_raw":
        return losses(seed, raw=True)
    if name not in CASES:
        raise ValueError(f"unknown case {name!r}: expected one of {', '.join(CASES)}")
    return globals()[name](seed)


def hf_family(name: str, seed: int = 0, batch: int = 2):
    """A Hugging Face family of hf_zoo.py with real random weights, traced and run eagerly.
    Traced through Dynamo, as the planner sees it (transformers' MoE experts take their
    custom grouped-matmul op there)."""
    from autoshard._testing import hf_zoo
    from autoshard._testing.capture import capture_model

    model, _ = hf_zoo.build(name, device="cpu")
    torch.manual_seed(seed)
    inputs = hf_zoo.FAMILIES[name][1](batch)
    return capture_model(f"hf:{name}", model, inputs, seed=seed, capture="dynamo")
