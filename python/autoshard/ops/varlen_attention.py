"""Variable-length attention (``torch.nn.attention.varlen.varlen_attn``, torchtitan's "varlen"
backend) on CPU.

The two ops it traces to, ``torch_attn._varlen_attn`` and ``torch_attn._varlen_attn_backward``,
are planned by cpp/src/rules/varlen_attention.cpp (the head row) and run on local shards
(ops/local_run.py). torch 2.13 implements them with CUDA kernels only (flash or cuDNN
attention over packed documents). ``varlen_attention_on_cpu()`` registers CPU kernels for both:
each document attends to itself (causal or not) through the CPU flash kernel, one call per
document, so a model with varlen attention runs on CPU, planned or as the single-device
reference, with the same math. Window attention and paged KV caches are refused.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_FORWARD = "torch_attn::_varlen_attn"
_BACKWARD = "torch_attn::_varlen_attn_backward"
_registered = False


def varlen_attention_on_cpu() -> None:
    """Registers the CPU kernels of the varlen ops (once per process; CUDA keeps torch's)."""
    global _registered
    if _registered:
        return
    import torch.nn.attention.varlen  # noqa: F401  (defines the ops)

    torch.library.register_kernel(_FORWARD, "cpu", _forward)
    torch.library.register_kernel(_BACKWARD, "cpu", _backward)
    _registered = True


def _documents(cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor | None):
    """(query range, key range) of each packed document."""
    q_at = cu_seq_q.tolist()
    k_at = q_at if cu_seq_k is None else cu_seq_k.tolist()
    return [
        (slice(q_at[i], q_at[i + 1]), slice(k_at[i], k_at[i + 1])) for i in range(len(q_at) - 1)
    ]


def _heads_first(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[L, H, D] -> [1, heads, L, D], GQA's KV heads repeated to the query's count."""
    x = x.transpose(0, 1).unsqueeze(0)
    return x.repeat_interleave(heads // x.shape[1], dim=1) if x.shape[1] != heads else x


def _check_supported(window_size, seqused_k=None, block_table=None) -> bool:
    """Whether the call is causal; refuses what the CPU kernels do not implement."""
    window = tuple(window_size or (-1, -1))
    if window not in ((-1, -1), (-1, 0)) or seqused_k is not None or block_table is not None:
        raise NotImplementedError(
            "autoshard's CPU varlen attention takes full or causal attention only (window "
            f"{list(window)}, seqused_k / block_table given: "
            f"{seqused_k is not None or block_table is not None}); run on a GPU"
        )
    return window == (-1, 0)


def _forward(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    is_causal=False,
    scale=None,
    window_size=None,
    enable_gqa=False,
    seqused_k=None,
    block_table=None,
    num_splits=None,
):
    is_causal = is_causal or _check_supported(window_size, seqused_k, block_table)
    heads = query.shape[1]
    out = torch.empty_like(query)
    lse = torch.empty(heads, query.shape[0], dtype=torch.float32)
    for q_rows, k_rows in _documents(cu_seq_q, cu_seq_k):
        o, l = aten._scaled_dot_product_flash_attention_for_cpu(
            _heads_first(query[q_rows], heads),
            _heads_first(key[k_rows], heads),
            _heads_first(value[k_rows], heads),
            0.0,
            is_causal,
            scale=scale,
        )
        out[q_rows] = o[0].transpose(0, 1)
        lse[:, q_rows] = l[0]
    return out, lse, torch.zeros(2, dtype=torch.uint64)


def _backward(
    grad_out,
    query,
    key,
    value,
    out,
    lse,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    is_causal,
    rng_state,
    scale=None,
    window_size=None,
):
    is_causal = is_causal or _check_supported(window_size)
    heads, kv_heads = query.shape[1], key.shape[1]
    grads = [torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)]
    for q_rows, k_rows in _documents(cu_seq_q, cu_seq_k):
        dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _heads_first(grad_out[q_rows], heads),
            _heads_first(query[q_rows], heads),
            _heads_first(key[k_rows], heads),
            _heads_first(value[k_rows], heads),
            _heads_first(out[q_rows], heads),
            lse[:, q_rows].unsqueeze(0).to(query.dtype).contiguous(),  # float32, as the op's
            0.0,
            is_causal,
            scale=scale,
        )
        grads[0][q_rows] = dq[0].transpose(0, 1)
        for g, d in ((grads[1], dk), (grads[2], dv)):  # GQA: a KV head's query group summed
            g[k_rows] = d[0].unflatten(0, (kv_heads, -1)).sum(1).transpose(0, 1)
    return tuple(grads)
