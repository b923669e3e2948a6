// Variable-length attention (torch.nn.attention.varlen.varlen_attn, torchtitan's "varlen"
// backend): packed documents, one token dim, document boundaries in cumulative offsets.
//   torch_attn._varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale,
//                           window_size, enable_gqa, seqused_k, block_table, num_splits)
//     -> (out [T, Hq, D], logsumexp [Hq, T], rng_state [2])
//   torch_attn._varlen_attn_backward(grad_out, q, k, v, out, logsumexp, cu_seq_q, cu_seq_k, max_q,
//                                    max_k, is_causal, rng_state, scale, window_size)
//     -> (grad_q, grad_k, grad_v)
// Two rows. Heads: every [T, H, D] tensor sharded on its head dim 1 and the logsumexp ([H, T])
// on dim 0; the offsets, the rng state and the paging tables are read whole (Replicate).
// Tokens (the batch row of packed documents): every [T, H, D] tensor on dim 0, the logsumexp on
// dim 1, the offsets whole; each rank attends within the documents its even block of tokens
// holds, its local offsets computed at run time from the global ones (ops/varlen_attention.py,
// which refuses a document that crosses a block boundary: torchtitan packs each batch row's
// documents apart, so a split at row boundaries never cuts one).
// `accept`: with GQA both head counts divide by the head shard count (rank r's query heads use
// exactly the KV heads it holds); the token dim splits evenly into blocks of whole max_q spans
// (with max_q the row length, as the fixed bound the trace needs: whole batch rows); no empty
// block.
// FLOPs: 4 * T * (T / N) * Hq * D (QK^T and PV for N documents of the mean length T / N, the
// lengths being data; on local shapes, so a token block is priced with the global mean length),
// half of that when causal; the backward 2.5x. Both run on local shards (ops/local_run.py).
#include <set>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

struct VarlenSpec {
  int activations;      // the leading [T, H, D] tensor inputs (q, k, v; backward: with grad_out, out)
  int lse_input;        // tensor-input index of the logsumexp, -1 when the op reads none
  int causal_arg;       // positional index of is_causal
  int cu_seq_arg;       // positional index of cu_seq_q
  int max_q_arg;        // positional index of max_q (the longest document, an upper bound)
  double flop_factor;   // 1 forward, 2.5 backward
};

// `dim` 1 (heads) or 0 (tokens) of the [T, H, D] tensors; the [H, T] logsumexp's other dim.
ShardingRow varlen_row(const RuleContext& ctx, const VarlenSpec& spec, int dim) {
  ShardingRow r = replicate_row(ctx);
  for (int i = 0; i < spec.activations; ++i) r.inputs[i] = S(dim);
  if (spec.lse_input >= 0) r.inputs[spec.lse_input] = S(1 - dim);
  for (size_t o = 0; o < ctx.outputs.size(); ++o) {
    if (!ctx.outputs[o]) continue;
    const int rank = ctx.outputs[o]->rank();
    r.outputs[o] = rank == 3 ? S(dim) : rank == 2 ? S(1 - dim) : R();
  }
  return r;
}

std::vector<ShardingRow> varlen_rows(const RuleContext& ctx, const VarlenSpec& spec) {
  for (int i = 0; i < spec.activations; ++i)
    if (input_meta(ctx, i).rank() != 3) return {};  // a paged KV cache: replicated
  return {varlen_row(ctx, spec, 1), varlen_row(ctx, spec, 0)};
}

bool varlen_accept(const RuleContext& ctx, const VarlenSpec& spec, const std::vector<Layout>& inputs) {
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if (has_empty_shard(ctx.mesh, inputs.at(i), ctx.inputs[i])) return false;
  std::set<int64_t> heads;
  for (int i = 0; i < spec.activations; ++i) heads.insert(ctx.inputs[i].shape[1]);
  const int64_t max_q = int_arg(ctx, spec.max_q_arg, "max_q", 0);
  for (int i = 0; i < spec.activations; ++i) {
    const int64_t blocks = shards_on_dim(ctx.mesh, inputs.at(i), 0);
    if (!divides(ctx.inputs[i].shape[0], blocks)) return false;
    // blocks of whole max_q-token spans: with max_q the batch row's length (the fixed bound the
    // trace needs), blocks of whole rows, which never cut a document
    if (blocks > 1 && max_q > 0 && (ctx.inputs[i].shape[0] / blocks) % max_q != 0) return false;
    const int64_t n = shards_on_dim(ctx.mesh, inputs.at(i), 1);
    for (int64_t h : heads)
      if (!divides(h, n)) return false;
  }
  return true;
}

double varlen_flops(const RuleContext& ctx, const VarlenSpec& spec, const std::vector<TensorMeta>& in) {
  const int q_at = spec.activations == 3 ? 0 : 1;  // the backward reads grad_out first
  const TensorMeta& q = in.at(q_at);
  const int cu = tensor_input_index(ctx, spec.cu_seq_arg);
  if (q.rank() != 3 || cu < 0 || in.at(cu).rank() != 1) return 0;
  const double documents = std::max<int64_t>(in.at(cu).shape[0] - 1, 1);
  const double mean_length = ctx.inputs.at(q_at).shape[0] / documents;  // the global token count
  const bool causal = bool_arg(ctx, spec.causal_arg, "is_causal", false);
  const double dense = 4.0 * q.shape[0] * mean_length * q.shape[1] * q.shape[2];
  return spec.flop_factor * dense * (causal ? 0.5 : 1.0);
}

OpRule varlen_rule(VarlenSpec spec) {
  OpRule r;
  r.rows = [spec](const RuleContext& ctx) { return varlen_rows(ctx, spec); };
  r.accept = [spec](const RuleContext& ctx, const std::vector<Layout>&, const std::vector<Layout>& ins) {
    return varlen_accept(ctx, spec, ins);
  };
  r.flops = [spec](const RuleContext& ctx, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) {
    return varlen_flops(ctx, spec, in);
  };
  return r;
}

}  // namespace

void register_varlen_attention_rules() {
  add_rule("torch_attn._varlen_attn.default", varlen_rule({3, -1, 7, 3, 5, 1.0}));
  // grad_out, q, k, v, out are [T, H, D]; logsumexp is tensor input 5
  add_rule("torch_attn._varlen_attn_backward.default", varlen_rule({5, 5, 10, 6, 8, 2.5}));
}

}  // namespace autoshard
