"""Models for the numeric rule validator (python/autoshard/validate.py) beyond models.py:
GPT-2 from ``transformers`` (random weights, loss from labels) and a Mixtral/DeepSeek-style
mixture-of-experts block. Every ``forward`` returns a scalar training loss, and every shape is
static (no data-dependent sizes), so the joint graph traces with fake tensors.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .models import Llama, LlamaConfig, RMSNorm


def llama3_small(attention: str = "sdpa") -> Llama:
    """A 2-layer Llama-3-style model: RMSNorm, real-pair rotary embeddings, grouped-query
    attention (4 query heads, 2 KV heads, repeat_interleave), SwiGLU MLP, embedding and
    cross-entropy."""
    return Llama(LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64,
                             ffn_dim=64, max_seq_len=16, attention=attention))


class GPT2LM(nn.Module):
    """``transformers.GPT2LMHeadModel`` with the loss it computes from ``labels`` as output."""

    def __init__(self, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, vocab_size: int = 128,
                 n_positions: int = 32, dropout: float = 0.1):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
                         n_positions=n_positions, resid_pdrop=dropout, embd_pdrop=dropout,
                         attn_pdrop=dropout, bos_token_id=0, eos_token_id=0)
        self.model = GPT2LMHeadModel(cfg)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels).loss


class MoEBlock(nn.Module):
    """Pre-norm residual mixture-of-experts block with SwiGLU experts.

    Routing: softmax over ``n_experts`` router logits, top-k (renormalised), the dense gate
    matrix built with ``scatter``. Dispatch: every (token, slot) pair becomes a row
    (``index_select`` of the token), each expert runs densely on all rows and a one-hot mask
    keeps its own rows, the gate weight of each row is read back from its token's gates with ``gather``, and rows are
    summed into their tokens with ``index_add``. The loss adds a load-balancing term."""

    def __init__(self, dim: int = 32, hidden: int = 48, n_experts: int = 4, top_k: int = 2):
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.norm = RMSNorm(dim, 1e-5)
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(n_experts, dim, hidden) * dim ** -0.5)
        self.w3 = nn.Parameter(torch.randn(n_experts, dim, hidden) * dim ** -0.5)
        self.w2 = nn.Parameter(torch.randn(n_experts, hidden, dim) * hidden ** -0.5)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = b * s
        h = self.norm(x).reshape(tokens, d)
        probs = torch.softmax(self.router(h), dim=-1)                       # [T, E]
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)                # [T, k]
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        gates = torch.zeros_like(probs).scatter(1, top_i, top_w)            # [T, E]
        token_of_row = torch.arange(tokens, device=x.device).repeat_interleave(self.top_k)
        expert_of_row = top_i.reshape(-1)                                   # [T*k]
        rows = h.index_select(0, token_of_row)                              # [T*k, D]
        out_rows = torch.zeros_like(rows)
        for e in range(self.n_experts):
            mine = (expert_of_row == e).unsqueeze(-1).to(rows.dtype)        # one-hot mask
            y = (F.silu(rows @ self.w1[e]) * (rows @ self.w3[e])) @ self.w2[e]
            out_rows = out_rows + mine * y
        row_gates = gates.index_select(0, token_of_row)                     # [T*k, E]
        row_gate = torch.gather(row_gates, 1, expert_of_row.unsqueeze(-1))  # [T*k, 1]
        moe = torch.zeros_like(h).index_add(0, token_of_row, out_rows * row_gate)
        y = x + moe.view(b, s, d)
        load = (gates > 0).to(probs.dtype).mean(dim=0)
        balance = (probs.mean(dim=0) * load).sum() * self.n_experts
        return ((y - target) ** 2).mean() + 0.01 * balance
