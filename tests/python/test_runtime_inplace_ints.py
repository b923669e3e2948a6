"""Integer bookkeeping that functionalisation turns into copy / slice_scatter / select_scatter /
fill / lift_fresh_copy ops (DTensor has no rule for some: they run on the runtime's replicated
path), on a one-rank gloo mesh, planned by the C++ planner, under both runtimes, compared with
the eager model (loss and every gradient, rtol 1e-5 / atol 1e-6):

- T5's ``_shift_right`` (in-place slice writes into a fresh integer tensor, a 0-d constant
  filled into column 0, ``masked_fill_`` of -100), its relative-position buckets (integer
  math, ``log`` of an int->float cast, ``torch.where``) and an additive attention mask;
- the Hugging Face T5 itself (hf_zoo's tiny config), once with dropout off and once with it on
  from the same generator state: on one rank the joint graph draws the same numbers as eager.

A T5 run "with dropout 0" must switch off ``config.dropout_rate``: T5's attention calls
``F.dropout(p=self.dropout)`` with the config's float, so setting ``nn.Dropout.p = 0`` leaves
the attention-probability dropout on, and the step then differs from an eager call made from
another generator state (as it must: that was the reported "wrong T5 loss on one rank").
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from autoshard import AutoParallel
from autoshard.runtime.module_state import load_full_state_dict, local_inputs
from autoshard.runtime.module_runtime import runtime_of

VOCAB, DIM, HEADS, SEQ, BUCKETS, MAX_DIST = 32, 16, 2, 8, 8, 16


def shift_right(labels: torch.Tensor, start: int = 0, pad: int = 0) -> torch.Tensor:
    """transformers' T5 ``_shift_right``."""
    shifted = labels.new_zeros(labels.shape)
    shifted[..., 1:] = labels[..., :-1].clone()
    shifted[..., 0] = start
    shifted.masked_fill_(shifted == -100, pad)
    return shifted


def relative_buckets(rel: torch.Tensor, bidirectional: bool) -> torch.Tensor:
    """transformers' T5 ``_relative_position_bucket``."""
    buckets = torch.zeros_like(rel)
    n = BUCKETS
    if bidirectional:
        n //= 2
        buckets = buckets + (rel > 0).to(torch.long) * n
        rel = torch.abs(rel)
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    exact = n // 2
    small = rel < exact
    large = exact + (torch.log(rel.float() / exact) / math.log(MAX_DIST / exact) * (n - exact)).to(
        torch.long
    )
    large = torch.min(large, torch.full_like(large, n - 1))
    return buckets + torch.where(small, rel, large)


class ShiftRightDecoder(nn.Module):
    """Decoder inputs from the labels by ``shift_right``, a relative-position bias, a padding
    mask as an additive bias, one attention layer and a cross-entropy that ignores -100."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.bias = nn.Embedding(BUCKETS, HEADS)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ids = shift_right(labels)
        h = self.embed(ids)
        b, s, _ = h.shape
        pos = torch.arange(s, dtype=torch.long, device=h.device)
        rel = pos[None, :] - pos[:, None]
        bias = self.bias(relative_buckets(rel, bidirectional=False)).permute(2, 0, 1)[None]
        bias = bias + (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        q, k, v = self.qkv(h).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v
        logits = self.out(att.transpose(1, 2).reshape(b, s, DIM))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def _compare(
    ref: nn.Module, meta: nn.Module, inputs: tuple, mesh, runtime: str, seed: int | None = None
) -> dict:
    with AutoParallel(
        meta, lambda: inputs, mesh, runtime=runtime, time_limit_s=5.0, plan_cache=False
    ) as autop:
        par = autop.apply_placement(autop.optimize_placement())
        step = autop.step
    par.to_empty(device="cpu")
    # non-persistent buffers are not in state_dict
    load_full_state_dict(par, ref.state_dict() | dict(ref.named_buffers()))
    args, kwargs = local_inputs(par, *inputs)
    if seed is not None:
        torch.manual_seed(seed)
    loss = par(*args, **kwargs)
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    loss.backward()
    if seed is not None:
        torch.manual_seed(seed)
    rloss = ref(*inputs)
    rloss.backward()
    assert torch.allclose(loss, rloss, rtol=1e-5, atol=1e-6), (float(loss), float(rloss))
    ref_grads = dict(ref.named_parameters())
    for n, p in par.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        r = ref_grads[n].grad
        assert (g is None) == (r is None), n
        if r is not None:
            assert torch.allclose(g, r, rtol=1e-5, atol=1e-6), (n, float((g - r).abs().max()))
    return {"step": step, "warnings": dict(runtime_of(par).runner.warnings)}


@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_shift_right_and_relative_buckets_match_eager(mesh1, runtime):
    torch.manual_seed(0)
    ref = ShiftRightDecoder()
    with torch.device("meta"):
        meta = ShiftRightDecoder()
    labels = torch.randint(0, VOCAB, (4, SEQ))
    labels[0, -3:] = -100  # ignored positions, which shift_right turns into padding
    labels[2, 1] = -100
    mask = torch.ones(4, SEQ, dtype=torch.long)
    mask[1, -2:] = 0
    res = _compare(ref, meta, (labels, mask), mesh1, runtime)
    targets = {str(n.target) for n in res["step"].gm.graph.nodes}
    # the functionalised in-place writes are in the graph this test is about
    for op in (
        "aten.copy.default",
        "aten.slice_scatter.default",
        "aten.select_scatter.default",
        "aten.fill.Tensor",
        "aten.masked_fill.Scalar",
    ):
        assert op in targets, (op, sorted(targets))


def _t5(dropout: float):
    from autoshard._testing import hf_zoo

    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(
        vocab_size=hf_zoo.VOCAB,
        d_model=hf_zoo.HIDDEN,
        d_kv=hf_zoo.HIDDEN // hf_zoo.HEADS,
        d_ff=hf_zoo.FFN,
        num_layers=hf_zoo.LAYERS,
        num_decoder_layers=hf_zoo.LAYERS,
        num_heads=hf_zoo.HEADS,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        dropout_rate=dropout,
    )
    return hf_zoo.LossOf(transformers.T5ForConditionalGeneration(cfg), ("input_ids", "labels"))


@pytest.mark.parametrize(
    "runtime,dropout", [("program", 0.0), ("interpret", 0.0), ("program", 0.1)]
)
def test_t5_matches_eager_on_one_rank(mesh1, runtime, dropout):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    ref = _t5(dropout)
    with torch.device("meta"):
        meta = _t5(dropout)
    inputs = (torch.randint(0, 256, (4, 16)), torch.randint(0, 256, (4, 16)))
    inputs[1][0, -4:] = -100
    # with dropout on, both draw from the same generator state
    _compare(ref, meta, inputs, mesh1, runtime, seed=123 if dropout else None)


class CacheCat(nn.Module):
    """A key/value cache that starts as ``torch.tensor([])`` (transformers' ``DynamicLayer``):
    ``torch.cat([empty, keys], dim=-2)`` skips the 1-D empty tensor."""

    def __init__(self):
        super().__init__()
        self.k = nn.Linear(DIM, DIM)

    def forward(self, x):
        keys = self.k(x).view(x.shape[0], x.shape[1], HEADS, DIM // HEADS).transpose(1, 2)
        cached = torch.cat([torch.tensor([]), keys], dim=-2)
        return cached.pow(2).mean()


def test_cat_skipped_empty_inputs_leave_the_graph():
    from autoshard.trace.tracer import trace_training_step

    with torch.device("meta"):
        meta = CacheCat()
    step = trace_training_step(meta, lambda: (torch.empty(4, SEQ, DIM),))
    cats = [n for n in step.gm.graph.nodes if n.target is torch.ops.aten.cat.default]
    assert cats
    for n in cats:
        assert all(t.meta["val"].dim() == 4 for t in n.args[0]), n.args


@pytest.mark.parametrize("runtime", ["program", "interpret"])
def test_cat_of_empty_cache_matches_eager(mesh1, runtime):
    torch.manual_seed(0)
    ref = CacheCat()
    with torch.device("meta"):
        meta = CacheCat()
    _compare(ref, meta, (torch.randn(4, SEQ, DIM),), mesh1, runtime)
