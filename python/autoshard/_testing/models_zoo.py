"""Models for the numeric rule validator (python/autoshard/testing/validate.py) beyond models.py:
GPT-2 from ``transformers`` (random weights, loss from labels), a Mixtral/DeepSeek-style
mixture-of-experts block (``MoEBlock``: index-based dispatch) and a DeepSeek-style MoE in the
grouped, capacity-based form (``DeepSeekMoEBlock``: einsum dispatch, experts as batched
matmuls, so expert parallelism is a placement the planner can choose). Every ``forward``
returns a scalar training loss, and every shape is static (no data-dependent sizes), so the
joint graph traces with fake tensors.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoshard.models import Llama, LlamaConfig, RMSNorm


def llama3_small(
    attention: str = "sdpa", dim: int = 32, vocab_size: int = 64, ffn_dim: int = 64, seq: int = 16
) -> Llama:
    """A 2-layer Llama-3-style model: RMSNorm, real-pair rotary embeddings, grouped-query
    attention (4 query heads, 2 KV heads, repeat_interleave), SwiGLU MLP, embedding and
    cross-entropy."""
    return Llama(
        LlamaConfig(
            dim=dim,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            vocab_size=vocab_size,
            ffn_dim=ffn_dim,
            max_seq_len=seq,
            attention=attention,
        )
    )


def llama3_memory() -> Llama:
    """llama3_small's architecture at dim 128, vocab 256 and 64 tokens: the model whose
    step memory the 4-rank tests measure against the prediction (tests/python/dist/
    memory_worker.py), with batch 8 about 4-5 MB a rank."""
    return llama3_small(dim=128, vocab_size=256, ffn_dim=256, seq=64)


class GPT2LM(nn.Module):
    """``transformers.GPT2LMHeadModel`` with the loss it computes from ``labels`` as output."""

    def __init__(
        self,
        n_layer: int = 2,
        n_embd: int = 64,
        n_head: int = 4,
        vocab_size: int = 128,
        n_positions: int = 32,
        dropout: float = 0.1,
    ):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            vocab_size=vocab_size,
            n_positions=n_positions,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            bos_token_id=0,
            eos_token_id=0,
        )
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
        self.w1 = nn.Parameter(torch.randn(n_experts, dim, hidden) * dim**-0.5)
        self.w3 = nn.Parameter(torch.randn(n_experts, dim, hidden) * dim**-0.5)
        self.w2 = nn.Parameter(torch.randn(n_experts, hidden, dim) * hidden**-0.5)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = b * s
        h = self.norm(x).reshape(tokens, d)
        probs = torch.softmax(self.router(h), dim=-1)  # [T, E]
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        gates = torch.zeros_like(probs).scatter(1, top_i, top_w)  # [T, E]
        token_of_row = torch.arange(tokens, device=x.device).repeat_interleave(self.top_k)
        expert_of_row = top_i.reshape(-1)  # [T*k]
        rows = h.index_select(0, token_of_row)  # [T*k, D]
        out_rows = torch.zeros_like(rows)
        for e in range(self.n_experts):
            mine = (expert_of_row == e).unsqueeze(-1).to(rows.dtype)  # one-hot mask
            y = (F.silu(rows @ self.w1[e]) * (rows @ self.w3[e])) @ self.w2[e]
            out_rows = out_rows + mine * y
        row_gates = gates.index_select(0, token_of_row)  # [T*k, E]
        row_gate = torch.gather(row_gates, 1, expert_of_row.unsqueeze(-1))  # [T*k, 1]
        moe = torch.zeros_like(h).index_add(0, token_of_row, out_rows * row_gate)
        y = x + moe.view(b, s, d)
        load = (gates > 0).to(probs.dtype).mean(dim=0)
        balance = (probs.mean(dim=0) * load).sum() * self.n_experts
        return ((y - target) ** 2).mean() + 0.01 * balance


class DeepSeekMoELayer(nn.Module):
    """One pre-norm residual DeepSeek-style MoE layer in the grouped, capacity-based form
    (GShard / Switch Transformer), so every shape is static. Returns ``(y, balance_loss)``.

    Tokens ``[B, T, D]`` are regrouped as ``[G, S, D]`` (``S = group_size``, default ``T``:
    one group per sequence; ``G = B*T/S``, which should be a multiple of the data-parallel
    degree). Per group:

    - router: scores ``softmax`` or ``sigmoid`` of ``h @ router`` ``[G, S, E]``, top-k experts
      per token, their weights renormalised to sum to 1 (``norm_topk``);
    - capacity: each expert takes at most ``C = ceil(capacity_factor * k * S / E)`` tokens
      per group. Slots are handed out first-choice first, then by token order (a cumulative
      sum over ``[k*S]``); an assignment past ``C`` is dropped (its token keeps the shared
      expert and the residual only), deterministically;
    - dispatch mask ``[G, S, E, C]`` (0/1) and combine weights ``[G, S, E, C]`` (the top-k
      weight in the token's slot);
    - ``dispatched = einsum(mask, h)`` ``[G, E, C, D]``, moved to expert-major ``[E, G, C, D]``
      (a transpose: with tokens sharded on G and experts on E over one mesh dim the planner's
      redistribution there is an all-to-all), SwiGLU experts as batched matmuls with weights
      ``w1, w3 [E, D, H]``, ``w2 [E, H, D]``, back to ``[G, E, C, D]``, combined by
      ``einsum(combine, out)`` into ``[G, S, D]``;
    - a shared expert (a dense SwiGLU of width ``shared_hidden``) on every token;
    - load-balancing loss ``E/k * sum_e f_e P_e`` (f: fraction of routed assignments,
      before capacity; P: mean normalised score), the Switch / DeepSeek expert-level
      auxiliary loss.
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        n_experts: int,
        top_k: int,
        shared_hidden: int,
        group_size: int | None = None,
        capacity_factor: float = 1.25,
        score_func: str = "softmax",
        norm_topk: bool = True,
    ):
        super().__init__()
        if score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be 'softmax' or 'sigmoid', got {score_func!r}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        self.n_experts, self.top_k, self.group_size = n_experts, top_k, group_size
        self.capacity_factor, self.score_func = capacity_factor, score_func
        self.norm_topk = norm_topk
        self.norm = RMSNorm(dim, 1e-5)
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(n_experts, dim, hidden) * dim**-0.5)
        self.w3 = nn.Parameter(torch.randn(n_experts, dim, hidden) * dim**-0.5)
        self.w2 = nn.Parameter(torch.randn(n_experts, hidden, dim) * hidden**-0.5)
        self.shared_gate = nn.Linear(dim, shared_hidden, bias=False)
        self.shared_up = nn.Linear(dim, shared_hidden, bias=False)
        self.shared_down = nn.Linear(shared_hidden, dim, bias=False)

    def capacity(self, group_size: int) -> int:
        """Slots per expert per group."""
        return max(1, math.ceil(self.capacity_factor * self.top_k * group_size / self.n_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        e, k = self.n_experts, self.top_k
        s = self.group_size or t
        if (b * t) % s:
            raise ValueError(f"{b * t} tokens do not split into groups of {s}")
        g, c = b * t // s, self.capacity(s)
        h = self.norm(x).reshape(g, s, d)
        logits = self.router(h)  # [G, S, E]
        scores = (
            torch.softmax(logits, dim=-1) if self.score_func == "softmax" else torch.sigmoid(logits)
        )
        top_w, top_i = torch.topk(scores, k, dim=-1)  # [G, S, k]
        if self.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        # chosen[g, j, s, e] = 1 where expert e is token s's j-th choice; slot-major order,
        # so every token's first choice claims a slot before any second choice
        experts = torch.arange(e, device=x.device)
        chosen = (top_i.transpose(1, 2).unsqueeze(-1) == experts).to(h.dtype)  # [G, k, S, E]
        flat = chosen.reshape(g, k * s, e)
        position = ((torch.cumsum(flat, dim=1) - 1.0) * flat).reshape(g, k, s, e).sum(1)
        routed = chosen.sum(1)  # [G, S, E] 0/1
        gate = (chosen * top_w.transpose(1, 2).unsqueeze(-1)).sum(1)  # [G, S, E]
        slots = torch.arange(c, device=x.device, dtype=h.dtype)
        # a position >= C matches no slot: that assignment is dropped
        dispatch = (position.unsqueeze(-1) == slots).to(h.dtype) * routed.unsqueeze(-1)
        combine = dispatch * gate.unsqueeze(-1)  # [G, S, E, C]
        dispatched = torch.einsum("gsec,gsd->gecd", dispatch, h)  # [G, E, C, D]
        expert_in = dispatched.transpose(0, 1).reshape(e, g * c, d)  # expert-major
        act = F.silu(torch.bmm(expert_in, self.w1)) * torch.bmm(expert_in, self.w3)
        expert_out = torch.bmm(act, self.w2).reshape(e, g, c, d).transpose(0, 1)  # [G, E, C, D]
        out = torch.einsum("gsec,gecd->gsd", combine, expert_out)
        out = out + self.shared_down(F.silu(self.shared_gate(h)) * self.shared_up(h))
        y = x + out.reshape(b, t, d)
        probs = scores if self.score_func == "softmax" else scores / scores.sum(-1, keepdim=True)
        f = routed.mean(dim=(0, 1)) * (e / k)
        balance = (f * probs.mean(dim=(0, 1))).sum()
        return y, balance


class DeepSeekMoEBlock(nn.Module):
    """A stack of ``n_layers`` DeepSeek-style MoE layers (``DeepSeekMoELayer``) with an MSE
    training loss plus ``balance_coef`` times the layers' load-balancing losses.

    DeepSeek-like (DeepSeekMoE / DeepSeek-V2/V3): many fine-grained routed experts (small
    ``hidden``, large ``n_experts``), top-k routing with softmax (V2) or sigmoid (V3) scores
    and renormalised top-k weights, a shared expert every token goes through, and an
    expert-level balance loss. Differs: capacity per expert per group (GShard / Switch style,
    tokens past it dropped) instead of dropless routing, so all shapes are static and expert
    parallelism is a placement (experts sharded on E, tokens exchanged by all-to-all) the
    planner can choose; no device-limited / node-limited routing, no auxiliary-loss-free bias
    (V3), no routed scaling factor; no attention (the MoE feed-forward alone)."""

    def __init__(
        self,
        dim: int = 32,
        hidden: int = 16,
        n_experts: int = 8,
        top_k: int = 2,
        shared_hidden: int | None = None,
        n_layers: int = 1,
        group_size: int | None = None,
        capacity_factor: float = 1.25,
        score_func: str = "softmax",
        norm_topk: bool = True,
        balance_coef: float = 0.01,
    ):
        super().__init__()
        self.balance_coef = balance_coef
        self.layers = nn.ModuleList(
            DeepSeekMoELayer(
                dim,
                hidden,
                n_experts,
                top_k,
                shared_hidden or 2 * hidden,
                group_size,
                capacity_factor,
                score_func,
                norm_topk,
            )
            for _ in range(n_layers)
        )

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        balance = x.new_zeros(())
        for layer in self.layers:
            x, b = layer(x)
            balance = balance + b
        return ((x - target) ** 2).mean() + self.balance_coef * balance
