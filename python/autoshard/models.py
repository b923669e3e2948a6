"""Test and demo models: a small MLP, a Llama-style decoder-only transformer and a small
convolutional net with BatchNorm.

Every model's ``forward`` returns a scalar training loss, so one traced step holds the whole
forward and backward pass. Attention is written with plain matmul + softmax (``attention=
"manual"``, default), with ``F.scaled_dot_product_attention`` (``attention="sdpa"``), with
FlexAttention and a caller's BlockMask (``attention="flex"``) or with variable-length attention
over packed documents (``attention="varlen"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention
from torch.nn.attention.varlen import varlen_attn


class MLP(nn.Module):
    """``layers`` Linear+ReLU+Linear blocks on ``dim`` features; loss = MSE against a target."""

    def __init__(self, dim: int = 16, hidden: int = 32, layers: int = 2, bias: bool = True):
        super().__init__()
        blocks = []
        for _ in range(layers):
            blocks.append(MLPBlock(dim, hidden, bias))
        self.layers = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        # written out rather than F.mse_loss: DTensor's mse_loss_backward rule divides by the
        # LOCAL element count when the input is batch-sharded (gradients n times too large)
        return ((x - target) ** 2).mean()


class MLPBlock(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool):
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)))


@dataclass(frozen=True)
class LlamaConfig:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 128
    ffn_dim: int = 128
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 16
    # "manual" (matmul + softmax), "sdpa" (causal), "flex" (FlexAttention with the BlockMask
    # passed to forward: causal, documents, ...) or "varlen" (causal within packed documents)
    attention: str = "manual"


def llama3_8b_config(n_layers: int = 32, seq_len: int = 2048) -> LlamaConfig:
    """The Llama-3-8B shape (dim 4096, 32 heads, 8 KV heads, ffn 14336, vocab 128256)."""
    return LlamaConfig(
        dim=4096,
        n_layers=n_layers,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_dim=14336,
        norm_eps=1e-5,
        rope_theta=500000.0,
        max_seq_len=seq_len,
        attention="sdpa",
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * norm * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None, positions=None):
    """cos/sin tables [seq, head_dim/2] of rotary embeddings (real arithmetic, no complex);
    [batch, seq, head_dim/2] at ``positions`` ([batch, seq]) where given. The positions'
    angles are computed from them, not read from a table of ``arange(seq)``: in a step traced
    in head-tail order that arange means the permuted positions (trace/load_balance.py)."""
    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    )
    if positions is None:
        positions = torch.arange(seq_len, dtype=torch.float32, device=device)
    ang = positions.to(torch.float32).unsqueeze(-1) * inv  # the outer product, any batch dims
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [b, s, h, d]; rotate pairs (even, odd) of the last dim.
    b, s, h, d = x.shape
    xr = x.reshape(b, s, h, d // 2, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    c = cos.view(-1, s, 1, d // 2)  # tables [s, d/2], or [b, s, d/2] at given positions
    sn = sin.view(-1, s, 1, d // 2)
    out = torch.stack([x0 * c - x1 * sn, x0 * sn + x1 * c], dim=-1)
    # the float32 tables promote a bf16 x (mixed precision): back to x's dtype, so q and k
    # meet v's in attention (a no-op, and no graph node, for float32)
    return out.reshape(b, s, h, d).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.attention = cfg.attention
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, attention_masks=None):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:  # grouped-query attention: share each KV head among `rep` query heads
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.attention == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.attention == "flex":
            o = flex_attention(q, k, v, block_mask=attention_masks)
        elif self.attention == "varlen":  # documents packed into one token dim
            cu_seqlens, max_len = attention_masks
            q, k, v = (t.transpose(1, 2).reshape(b * s, -1, self.head_dim) for t in (q, k, v))
            o = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, window_size=(-1, 0))
            o = o.view(b, s, -1, self.head_dim).transpose(1, 2)
        else:
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
            mask = torch.triu(torch.full((s, s), float("-inf"), device=x.device), diagonal=1)
            o = torch.matmul(torch.softmax(scores + mask, dim=-1), v)
        o = o.transpose(1, 2).reshape(b, s, -1)
        return self.wo(o)


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin, attention_masks=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, attention_masks)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Decoder-only Llama-style transformer; ``forward(tokens, labels)`` returns the mean
    next-token cross-entropy loss. The rotary tables are computed inside forward (no buffers),
    so the model has parameters only. With ``attention="flex"`` forward takes the attention's
    BlockMask too (``forward(tokens, labels, attention_masks)``), as torchtitan's models do,
    and with ``attention="varlen"`` the packed documents' ``(cu_seqlens, max_len)`` (causal
    attention within each document, ``torch.nn.attention.varlen``; the batch and sequence
    packed into one token dim, documents delimited by the int32 offsets ``cu_seqlens``); and
    ``positions`` ([batch, seq], default ``0 .. seq - 1``), the position of each token for the
    rotary embedding, for a sequence stored in another order (load_balance.
    document_head_tail_order)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(
        self, tokens: torch.Tensor, labels: torch.Tensor, attention_masks=None, positions=None
    ) -> torch.Tensor:
        if (attention_masks is None) == (self.cfg.attention in ("flex", "varlen")):
            raise ValueError(
                "Llama: pass attention_masks exactly when attention is 'flex' (a BlockMask) or "
                f"'varlen' ((cu_seqlens, max_len)); got attention={self.cfg.attention!r}, "
                f"attention_masks {'None' if attention_masks is None else 'given'}"
            )
        b, s = tokens.shape
        cos, sin = rope_tables(
            self.cfg.dim // self.cfg.n_heads,
            s,
            self.cfg.rope_theta,
            device=tokens.device,
            positions=positions,
        )
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, attention_masks)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.reshape(b * s, -1).float(), labels.reshape(b * s))


class TinyGPT(nn.Module):
    """A GPT-style causal transformer (learned embedding, LayerNorm, fused QKV projection,
    GELU MLP, untied head, mean cross-entropy) whose sizes need not divide a world size:
    the uneven-shard tests use hidden 32 on 3 ranks, a vocabulary of 50 on 4, 7 heads."""

    def __init__(self, dim: int = 32, n_heads: int = 4, vocab_size: int = 64, n_layers: int = 2):
        super().__init__()
        self.n_heads = n_heads
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class GPTBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class ConvBn(nn.Module):
    """A convolution and a linear head, each followed by BatchNorm: in training, batch
    statistics and running statistics written in place. No bias before a BatchNorm (its
    gradient is zero, only rounding noise)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4, bias=False)
        self.bn1d = nn.BatchNorm1d(4)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return self.bn1d(self.head(h.mean(dim=(2, 3))))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.features(x), target)
