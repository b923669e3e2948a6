"""Tiny configurations of common Hugging Face model families, each returning its training loss,
for checking that autoshard traces and plans them out of the box (tools/hf_coverage.py,
tests/python/test_hf_coverage.py).

Every family is ``name -> (model builder, input builder)``: the model comes from
``transformers`` with a small config (2 layers, hidden 64, 8 heads where the family has them)
and is wrapped so ``forward(*inputs)`` returns the scalar loss the model computes from its
labels; ``inputs(batch)`` builds the example inputs (token ids, labels, pixels) of a batch.
``losses`` is not a transformers model: a small regression/classification head with the
common torch losses (mse, l1, smooth-l1, BCE with logits, KL, cross-entropy with label
smoothing and ignore_index).

``check_family(name)`` traces one family's training step, lists the ops without a sharding
rule and, when there are none, plans it on a virtual mesh (default 8x8, fake process group).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256
HIDDEN = 64
HEADS = 8
KV_HEADS = 4
LAYERS = 2
FFN = 128
SEQ = 16
IMAGE = 32
PATCH = 8


class LossOf(nn.Module):
    """``forward(*inputs)`` calls the wrapped transformers model with ``names`` as keywords
    (plus ``extra``) and returns its ``.loss``."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **extra: Any):
        super().__init__()
        self.model = model
        self.names = names
        self.extra = extra

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs)), **self.extra).loss


class LossZoo(nn.Module):
    """Two linear heads and the common torch losses on their outputs, summed."""

    def __init__(self, dim: int = HIDDEN, classes: int = 32):
        super().__init__()
        self.body = nn.Linear(dim, dim)
        self.cls = nn.Linear(dim, classes)
        self.reg = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, target: torch.Tensor, labels: torch.Tensor, multi: torch.Tensor
    ) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        y = self.reg(h)
        logits = self.cls(h)
        flat = logits.flatten(0, -2)
        loss = F.mse_loss(y, target)
        loss = loss + F.l1_loss(y, target)
        loss = loss + F.smooth_l1_loss(y, target, beta=0.5)
        loss = loss + F.huber_loss(y, target, delta=0.5)
        loss = loss + F.binary_cross_entropy_with_logits(logits, multi)
        loss = loss + F.kl_div(
            F.log_softmax(logits, -1),
            F.softmax(y[..., : logits.shape[-1]], -1),
            reduction="batchmean",
        )
        loss = loss + F.cross_entropy(
            flat, labels.flatten(), label_smoothing=0.1, ignore_index=-100
        )
        loss = loss + F.cross_entropy(flat, labels.flatten(), reduction="sum") / 100
        return loss


def _decoder_cfg(cfg_cls, **extra):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=4 * SEQ,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    base.update(extra)
    return cfg_cls(**base)


def _causal_lm(model_cls: str, cfg_cls: str, **extra) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers as T

        cfg = _decoder_cfg(getattr(T, cfg_cls), **extra)
        return LossOf(getattr(T, model_cls)(cfg), ("input_ids", "labels"))

    return build


def _in_dtype(build: Callable[[], nn.Module], dtype: torch.dtype) -> Callable[[], nn.Module]:
    return lambda: build().to(dtype)


def _tokens(batch: int):
    return (torch.randint(0, VOCAB, (batch, SEQ)), torch.randint(0, VOCAB, (batch, SEQ)))


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=LAYERS,
        n_embd=HIDDEN,
        n_head=HEADS,
        vocab_size=VOCAB,
        n_positions=4 * SEQ,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LossOf(GPT2LMHeadModel(cfg), ("input_ids", "labels"))


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=4 * SEQ,
    )
    return LossOf(BertForMaskedLM(cfg), ("input_ids", "labels"))


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=HIDDEN // HEADS,
        d_ff=FFN,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return LossOf(T5ForConditionalGeneration(cfg), ("input_ids", "labels"))


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        image_size=IMAGE,
        patch_size=PATCH,
        num_labels=16,
    )
    return LossOf(ViTForImageClassification(cfg), ("pixel_values", "labels"))


def _vit_inputs(batch: int):
    return (torch.randn(batch, 3, IMAGE, IMAGE), torch.randint(0, 16, (batch,)))


def _clip() -> nn.Module:
    from transformers import CLIPConfig, CLIPModel

    text = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=4 * SEQ,
        projection_dim=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = dict(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        image_size=IMAGE,
        patch_size=PATCH,
        projection_dim=32,
    )
    cfg = CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
    return LossOf(CLIPModel(cfg), ("input_ids", "pixel_values"), return_loss=True)


def _clip_inputs(batch: int):
    return (torch.randint(0, VOCAB, (batch, SEQ)), torch.randn(batch, 3, IMAGE, IMAGE))


def _losses_inputs(batch: int):
    return (
        torch.randn(batch, SEQ, HIDDEN),
        torch.randn(batch, SEQ, HIDDEN),
        torch.randint(0, 32, (batch, SEQ)),
        torch.rand(batch, SEQ, 32),
    )


_MOE = dict(num_local_experts=4, num_experts_per_tok=2)
_DEEPSEEK = dict(
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    n_group=2,
    topk_group=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    head_dim=8,
    num_key_value_heads=HEADS,
    rope_interleave=True,
)

# name -> (model builder, inputs(batch) builder)
FAMILIES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple]]] = {
    "llama": (_causal_lm("LlamaForCausalLM", "LlamaConfig"), _tokens),
    "qwen2": (_causal_lm("Qwen2ForCausalLM", "Qwen2Config"), _tokens),
    "qwen3": (_causal_lm("Qwen3ForCausalLM", "Qwen3Config", head_dim=HIDDEN // HEADS), _tokens),
    "mistral": (_causal_lm("MistralForCausalLM", "MistralConfig"), _tokens),
    "mixtral": (_causal_lm("MixtralForCausalLM", "MixtralConfig", **_MOE), _tokens),
    # bfloat16 experts take torch's grouped matmul (aten._grouped_mm) instead of
    # transformers' float32 fallback op
    "mixtral_bf16": (
        _in_dtype(_causal_lm("MixtralForCausalLM", "MixtralConfig", **_MOE), torch.bfloat16),
        _tokens,
    ),
    "gemma2": (
        _causal_lm(
            "Gemma2ForCausalLM",
            "Gemma2Config",
            head_dim=HIDDEN // HEADS,
            query_pre_attn_scalar=HIDDEN // HEADS,
            sliding_window=8,
        ),
        _tokens,
    ),
    "gemma3": (
        _causal_lm(
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            head_dim=HIDDEN // HEADS,
            query_pre_attn_scalar=HIDDEN // HEADS,
            sliding_window=8,
        ),
        _tokens,
    ),
    "phi3": (_causal_lm("Phi3ForCausalLM", "Phi3Config"), _tokens),
    "gpt2": (_gpt2, _tokens),
    "bert": (_bert, _tokens),
    "t5": (_t5, _tokens),
    "vit": (_vit, _vit_inputs),
    "clip": (_clip, _clip_inputs),
    "deepseek_v3": (_causal_lm("DeepseekV3ForCausalLM", "DeepseekV3Config", **_DEEPSEEK), _tokens),
    "losses": (LossZoo, _losses_inputs),
}


def build(name: str, device: str | torch.device = "meta") -> tuple[nn.Module, Callable[[], tuple]]:
    """The family's model (on ``device``, default meta) and its ``input_fn`` for a batch of 8."""
    make_model, make_inputs = FAMILIES[name]
    torch.manual_seed(0)
    with torch.device(device):
        model = make_model()
    return model, lambda: make_inputs(8)


@dataclass
class FamilyResult:
    name: str
    ok: bool
    missing: list[str] = field(default_factory=list)  # ops without a sharding rule
    error: str | None = None  # anything else that failed (trace, plan)
    nodes: int = 0
    trace_s: float = 0.0
    plan_s: float = 0.0

    def status(self) -> str:
        if self.ok:
            return "OK"
        if self.missing:
            return "missing: " + ", ".join(self.missing)
        return f"error: {self.error}"


def missing_ops(graph: dict | str) -> list[str]:
    """Ops of ``graph`` without a sharding rule (enumerated on a 2-rank mesh)."""
    from autoshard._testing.capture import enumerate_strategies

    return sorted({u["op"] for u in enumerate_strategies(graph, (2,))["unsupported"]})


def check_family(
    name: str, mesh_shape: tuple[int, ...] = (8, 8), time_limit_s: float = 5.0, plan: bool = True
) -> FamilyResult:
    """Traces ``name``'s training step; lists missing rules; plans it on a virtual mesh."""
    import json

    from torch.distributed.tensor import Replicate, Shard

    from autoshard.api.autoparallel import AutoParallel
    from autoshard.trace.fake_pg import fake_world

    model, input_fn = build(name)
    res = FamilyResult(name, ok=False)
    names = ("dp", "tp") if len(mesh_shape) == 2 else None
    try:
        with fake_world(mesh_shape, names) as mesh:
            t0 = time.perf_counter()
            with AutoParallel(model, input_fn, mesh, time_limit_s=time_limit_s) as autop:
                res.trace_s = time.perf_counter() - t0
                graph = autop.graph_json()
                res.nodes = sum(1 for n in json.loads(graph)["nodes"] if n["op"] != "placeholder")
                res.missing = missing_ops(graph)
                if res.missing or not plan:
                    res.ok = not res.missing
                    return res
                batch = (Shard(0),) + (Replicate(),) * (len(mesh_shape) - 1)
                autop.add_input_constraints([batch] * len(autop.step.input_nodes))
                t1 = time.perf_counter()
                autop.optimize_placement()
                res.plan_s = time.perf_counter() - t1
                res.ok = True
    except Exception as e:  # reported per family
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        res.error = f"{type(e).__name__}: {first}"
    return res
