"""Variable-length attention (``torch.nn.attention.varlen.varlen_attn``, torchtitan's "varlen"
backend): a block of the packed tokens, and the ops on CPU.

The two ops it traces to, ``torch_attn._varlen_attn`` and ``torch_attn._varlen_attn_backward``,
are planned by cpp/src/rules/varlen_attention.cpp (a head row and a token row) and run on local
shards (ops/local_run.py). In the token row each rank holds an even block of the packed tokens
and the whole offsets; ``local_offsets`` gives the offsets of the documents inside the block,
counted from its start, and refuses a document that crosses the block's edges (a split at batch
rows never cuts one: torchtitan packs each row's documents apart).

torch 2.13 implements the ops with CUDA kernels only (flash or cuDNN attention over packed
documents). ``varlen_attention_on_cpu()`` registers CPU kernels for both: each document
attends to itself (causal or not) through the CPU flash kernel, one call per document, so a
model with varlen attention runs on CPU, planned or as the single-device reference, with the
same math. Window attention and paged KV caches are refused.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from autoshard.ops import context_parallel

aten = torch.ops.aten
# op -> (index of q among the tensor inputs, positional indices of cu_seq_q and cu_seq_k)
VARLEN_OPS = {
    "torch_attn._varlen_attn.default": (0, (3, 4)),
    "torch_attn._varlen_attn_backward.default": (1, (6, 7)),
}
TOKEN_DIM = 0  # q is [T, H, D]
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


def needs_local_offsets(op: str, input_layouts: Sequence[Any] | None) -> bool:
    """Whether ``op`` in these input layouts (the plan's) holds a block of the tokens."""
    spec = VARLEN_OPS.get(op)
    if spec is None or input_layouts is None:
        return False
    return any(p == f"S({TOKEN_DIM})" for p in input_layouts[spec[0]] or ())


def local_offsets(cu_seq: torch.Tensor, start, length: int) -> torch.Tensor:
    """The offsets of the documents in packed tokens ``start .. start + length``, counted from
    ``start``, the documents outside the block empty; a document crossing either edge is
    refused when the call runs."""
    end = start + length
    edges_are_boundaries = (cu_seq == start).any() & (cu_seq == end).any()
    torch._assert_async(
        edges_are_boundaries,
        "autoshard: a varlen attention document crosses the edge of a rank's block of packed "
        "tokens (the plan splits the token dim evenly); pack the documents so that each batch "
        "row holds whole documents, or keep the token dim of attention unsplit",
    )
    # every document kept, those outside the block empty (a static shape: the lowered program
    # records no data-dependent size)
    return (cu_seq - start).clamp(0, length)


def call_on_token_block(
    op: str,
    args: Sequence[Any],
    kwargs: dict,
    input_layouts: Sequence[Any],
    mesh_shape: Sequence[int],
    coordinate: Callable[[int], Any],
    tokens: int,
    call: Callable,
) -> Any:
    """``call`` (the op on local shards) with the offsets of the documents in this rank's block
    of the ``tokens`` packed tokens (layouts: the plan's, one list per tensor input)."""
    q_at, offset_args = VARLEN_OPS[op]
    start = context_parallel.query_offset(
        input_layouts[q_at], mesh_shape, coordinate, tokens, dim=TOKEN_DIM
    )
    args = list(args)
    length = args[0].shape[TOKEN_DIM]  # q, or the backward's grad_out: the block's tokens
    for at in offset_args:
        if args[at] is not None:
            args[at] = local_offsets(args[at], start, length)
    return call(*args, **kwargs)


def _documents(cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor | None):
    """(query range, key range) of each packed document."""
    q_at = cu_seq_q.tolist()
    k_at = q_at if cu_seq_k is None else cu_seq_k.tolist()
    return [  # empty documents (a token block's offsets keep those outside it) skipped
        (slice(q_at[i], q_at[i + 1]), slice(k_at[i], k_at[i + 1]))
        for i in range(len(q_at) - 1)
        if q_at[i + 1] > q_at[i]
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
