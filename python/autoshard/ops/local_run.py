"""Ops the runtime runs on local shards, in the layouts the plan priced, instead of through
DTensor's own strategies: one registry, read by the reference interpreter (and so by the
program lowered from it), added to by the ops autoshard defines (local_map.py)."""

from __future__ import annotations

from typing import Any

import torch.fx as fx

# Ops whose arguments carry no global sizes, so the plan's rows (C++ rules, validated
# numerically on local shards by validate.py) run on local shards directly: DTensor 2.13 has
# no rule for them, or one that covers fewer layouts than the C++ rule (convolution: batch
# splits only; a channel split would come out in the wrong layout) or none that keeps the
# plan's Partial (histc with a fixed range: per-shard counts add up). The attention kernels
# are independent per (batch, head), so every one of them (CPU, and CUDA's flash, efficient
# and cuDNN ones, which DTensor has strategies for) runs on local shards in the C++ rule's
# rows, the layouts the plan priced: DTensor's strategies differ from them (the efficient
# kernel's empty logsumexp comes out replicated where the plan shards it; a bias of size 1
# on the batch or head dim would be sharded on that dim). FlexAttention's higher-order ops
# (folded into flex_attention.FlexAttentionCall nodes) have no DTensor rule at all: their
# block mask and mod buffers follow the batch / head rows of cpp/src/rules/flex_attention.cpp.
LOCAL_OPS = {
    "higher_order.flex_attention",
    "higher_order.flex_attention_backward",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_flash_attention_backward.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_efficient_attention_backward.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_cudnn_attention_backward.default",
    "torch_attn._varlen_attn.default",  # ops/varlen_attention.py: per head
    "torch_attn._varlen_attn_backward.default",
    "aten.convolution.default",
    "aten.convolution_backward.default",
    "aten._grouped_mm.default",
    "aten.histc.default",
    "transformers.grouped_mm_fallback.default",
    "transformers.grouped_mm_fallback_backward.default",
}


# op -> the op that runs in its place on local shards (local_map.py: a region's global op,
# whose fake kernel works on global shapes, runs as its local twin)
LOCAL_IMPLS: dict[str, Any] = {}


# op -> (argument index, output index): the argument is that output's global shape, so a
# local run passes the output's local shape instead
OUTPUT_SIZE_ARGS = {
    "aten.convolution_backward.default": (3, 2),  # bias_sizes: grad_bias
}


def runs_locally(node: fx.Node) -> bool:
    return str(node.target) in LOCAL_OPS


def local_impl(target: Any) -> Any:
    """The op to call for ``target`` on local shards: its local twin if it has one."""
    return LOCAL_IMPLS.get(str(target), target)


def register_local_op(op: Any, local_twin: Any = None) -> None:
    """``op`` runs on local shards; ``local_twin``, if given, runs in its place there."""
    LOCAL_OPS.add(str(op))
    if local_twin is not None:
        LOCAL_IMPLS[str(op)] = local_twin
