// Scaled dot-product attention kernels (forward and backward): flash (CUDA), flash for CPU,
// memory-efficient, cuDNN and the math fallback.
// Attention is independent per (batch, head), so two rows exist: shard dim 0 (batch) or dim 1
// (heads) of every activation-shaped tensor together: q, k, v, out, logsumexp, grads, and
// the math kernel's attention weights. Tensors of rank < 3 (philox seed/offset, rng_state,
// cum_seq, an empty debug mask) stay Replicate. An attention bias / mask follows the row on a
// dim where it has the full size and is Replicate where it broadcasts (size 1 or missing):
// one row of a broadcast bias serves every batch / head, so it cannot be split along them
// (DTensor 2.13's efficient-attention strategy shards the bias on that dim whatever its size,
// which would leave the ranks after the first an empty bias; the CUDA kernel itself takes only
// [B, H, Sq, Skv] biases, broadcasts expanded, where both rules agree). A backward that returns
// a bias gradient (efficient) has no row on a dim its bias broadcasts over (the gradient would
// be summed over the ranks), and lays the gradient out as the bias; the others (a CPU flash
// mask is not differentiated) keep the row with the mask replicated.
// Grouped-query attention (k/v with fewer heads than q): rank r's q heads must use exactly the
// kv heads rank r holds, which holds iff both head counts divide by the number of shards of the
// head dim; `accept` enforces that (for equal head counts, uneven chunks line up by themselves).
// Sequence row (context parallelism, the all-gather-K/V recipe; CPU flash kernel only, the one
// whose local call ops/context_parallel.py rewrites): q, out, logsumexp (and grad_out, grad_q)
// shard dim 2, the query sequence; k and v are Replicate (the redistribution all-gathers them);
// in the backward grad_k / grad_v are Partial(sum) (each rank's queries' share), which the
// redistribution reduce-scatters back to the sequence shard. A mask follows q's sequence dim
// where it has the full size, else Replicate. A causal call is not a causal call on the local
// shards (SDPA's is_causal aligns the mask top-left): the runtime runs it from the positions the
// rank's queries hold (block kernels over position chunks, ops/context_parallel.py and
// ops/attention_blocks.py). `accept` requires an even split of the query sequence (the offset
// is coordinate x local length).
// FLOPs: forward 4*B*H*Sq*Skv*D (QK^T and PV), backward 2.5x that, on local shapes; half of
// that for a causal call of a kernel that skips the masked blocks (flash, CPU flash,
// efficient, cuDNN; the sequence row's block kernels compute the pairs at or before each query
// too, ops/attention_blocks.py), dense for the math kernel, which materialises the mask. Without
// the load-balanced split (docs/context_parallel.md) the sequence row's causal work is uneven
// (rank r of n owns (2r+1)/n^2 of the causal pairs, the last rank (2n-1)/n^2), and the slowest
// rank sets the step's time.
// Note for the runtime: DTensor 2.13 has no rule for _scaled_dot_product_flash_attention_for_cpu
// (+_backward), and its CUDA kernels' strategies differ from these rows (the bias above), so
// every kernel here runs on local shards in these rows (runtime._LOCAL_OPS: to_local, call,
// from_local), and a plan carries over from one kernel to another by role
// (python/autoshard/attention_kernels.py).
#include <optional>
#include <set>
#include <string>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

struct AttentionSpec {
  int q_input;                           // tensor-input index of q (k and v follow it)
  std::vector<size_t> bias_args;         // positional args holding a bias / mask, if any
  std::vector<const char*> bias_kwargs;  // keyword args holding a bias / mask
  double flop_factor;                    // 1 forward, 2.5 backward
  int grad_bias_output = -1;             // output holding the bias gradient (bias-shaped)
  bool seq_row = false;                  // offers the sequence row (q sharded, k/v replicated)
  int causal_arg = -1;                   // positional arg of is_causal, for kernels that skip masked blocks
};

AttentionSpec causal_at(AttentionSpec spec, int pos) {
  spec.causal_arg = pos;
  return spec;
}

std::set<int> bias_inputs(const RuleContext& ctx, const AttentionSpec& spec) {
  std::set<int> out;
  for (size_t pos : spec.bias_args)
    if (int i = tensor_input_index(ctx, pos); i >= 0) out.insert(i);
  for (const char* name : spec.bias_kwargs)
    if (int i = tensor_kwarg_index(ctx, name); i >= 0) out.insert(i);
  return out;
}

// Placement of a broadcastable bias for a row sharding q's dim `dim` (q is 4-D [B,H,S,D]).
Placement bias_placement(const TensorMeta& q, const TensorMeta& bias, int dim) {
  int bdim = dim - (q.rank() - bias.rank());
  if (bdim < 0 || bias.shape[bdim] != q.shape[dim] || bias.shape[bdim] == 1) return R();
  return S(bdim);
}

// The sequence row: q's sequence dim (2) sharded, k and v (the two tensors after q) replicated.
// Outputs of rank >= 3 shard dim 2 (out, logsumexp [B,H,S], grad_out, grad_q), except the
// backward's grad_k / grad_v (the outputs after grad_q): Partial(sum) over the ranks' queries.
ShardingRow sequence_row(const RuleContext& ctx, const AttentionSpec& spec) {
  const TensorMeta& q = input_meta(ctx, spec.q_input);
  const std::set<int> biases = bias_inputs(ctx, spec);
  const bool backward = spec.q_input == 1;
  ShardingRow r = replicate_row(ctx);
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const TensorMeta& m = ctx.inputs[i];
    const int at = static_cast<int>(i);
    if (biases.count(at)) {
      r.inputs[i] = bias_placement(q, m, 2);
    } else if (at == spec.q_input + 1 || at == spec.q_input + 2) {
      r.inputs[i] = R();  // k, v: gathered whole
    } else {
      r.inputs[i] = m.rank() >= 3 ? S(2) : R();
    }
  }
  for (size_t o = 0; o < ctx.outputs.size(); ++o) {
    if (!ctx.outputs[o]) continue;
    if (backward && (o == 1 || o == 2))
      r.outputs[o] = P();  // grad_k, grad_v: this rank's queries' contributions
    else
      r.outputs[o] = ctx.outputs[o]->rank() >= 3 ? S(2) : R();
  }
  return r;
}

std::vector<ShardingRow> attention_rows(const RuleContext& ctx, const AttentionSpec& spec) {
  const TensorMeta& q = input_meta(ctx, spec.q_input);
  if (q.rank() != 4) return {};  // only the batched [B,H,S,D] layout is understood
  const std::set<int> biases = bias_inputs(ctx, spec);
  const int gb = spec.grad_bias_output;
  const bool owes_bias_grad = gb >= 0 && static_cast<size_t>(gb) < ctx.outputs.size() && ctx.outputs[gb];
  std::vector<ShardingRow> rows;
  for (int dim : {0, 1}) {
    ShardingRow r = replicate_row(ctx);
    bool broadcast_bias = false;
    std::optional<Placement> bias_layout;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      const TensorMeta& m = ctx.inputs[i];
      if (biases.count(static_cast<int>(i))) {
        r.inputs[i] = bias_placement(q, m, dim);
        broadcast_bias = broadcast_bias || r.inputs[i].is_replicate();
        bias_layout = r.inputs[i];
      } else {
        r.inputs[i] = m.rank() >= 3 ? S(dim) : R();
      }
    }
    // A backward with a bias broadcast along `dim` would owe a bias gradient summed over the
    // ranks (a Partial this rule does not offer); keep such calls replicated on that dim.
    // Backwards that return no bias gradient (a mask is not differentiated: CPU flash, cuDNN)
    // keep the row: the broadcast mask is read, whole, by every rank.
    if (owes_bias_grad && broadcast_bias) continue;
    for (size_t o = 0; o < ctx.outputs.size(); ++o) {
      if (!ctx.outputs[o]) continue;
      r.outputs[o] = ctx.outputs[o]->rank() >= 3 ? S(dim) : R();
    }
    // The bias gradient has the bias's shape, so its dims are the bias's (a bias of rank < 4
    // is sharded on an earlier dim than q).
    if (owes_bias_grad && bias_layout) r.outputs[gb] = *bias_layout;
    rows.push_back(r);
  }
  if (spec.seq_row) rows.push_back(sequence_row(ctx, spec));
  return dedup_rows(std::move(rows));
}

// GQA alignment: when activation tensors disagree on the head count, every head count must
// divide by the number of shards of the head dim.
bool attention_accept(const RuleContext& ctx, const AttentionSpec& spec, const std::vector<Layout>&,
                      const std::vector<Layout>& inputs) {
  // The attention kernels fail on empty blocks (the CPU flash kernel dies with SIGFPE when a
  // rank gets 0 heads, e.g. 4 heads chunked over 3 ranks as 2,2,0).
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if (has_empty_shard(ctx.mesh, inputs.at(i), ctx.inputs[i])) return false;
  // The sequence row's causal mask is offset by coordinate x local length: an even split.
  const TensorMeta& q = ctx.inputs.at(spec.q_input);
  if (q.rank() == 4 && !divides(q.shape[2], shards_on_dim(ctx.mesh, inputs.at(spec.q_input), 2))) return false;
  const std::set<int> biases = bias_inputs(ctx, spec);
  std::set<int64_t> heads;
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if (!biases.count(static_cast<int>(i)) && ctx.inputs[i].rank() == 4) heads.insert(ctx.inputs[i].shape[1]);
  if (heads.size() <= 1) return true;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (biases.count(static_cast<int>(i)) || ctx.inputs[i].rank() != 4) continue;
    int64_t n = shards_on_dim(ctx.mesh, inputs.at(i), 1);
    for (int64_t h : heads)
      if (!divides(h, n)) return false;
  }
  return true;
}

double attention_flops(const std::vector<TensorMeta>& in, const AttentionSpec& spec) {
  const TensorMeta& q = in.at(spec.q_input);
  const TensorMeta& k = in.at(spec.q_input + 1);
  if (q.rank() != 4 || k.rank() != 4) return 0;
  double b = q.shape[0], h = q.shape[1], sq = q.shape[2], d = q.shape[3], skv = k.shape[2];
  return spec.flop_factor * 4.0 * b * h * sq * skv * d;
}

OpRule attention_rule(AttentionSpec spec) {
  OpRule r;
  r.rows = [spec](const RuleContext& ctx) { return attention_rows(ctx, spec); };
  r.accept = [spec](const RuleContext& ctx, const std::vector<Layout>& outs, const std::vector<Layout>& ins) {
    return attention_accept(ctx, spec, outs, ins);
  };
  r.flops = [spec](const RuleContext& ctx, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) {
    const bool causal = spec.causal_arg >= 0 && bool_arg(ctx, spec.causal_arg, "is_causal", false);
    return attention_flops(in, spec) * (causal ? 0.5 : 1.0);  // about half the pairs are masked
  };
  return r;
}

}  // namespace

void register_attention_rules() {
  // _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask, scale)
  add_rule("aten._scaled_dot_product_flash_attention_for_cpu.default",
           attention_rule(causal_at({0, {}, {"attn_mask"}, 1.0, -1, true}, 4)));
  // ..._backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale)
  add_rule("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
           attention_rule(causal_at({1, {}, {"attn_mask"}, 2.5, -1, true}, 7)));
  // _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale)
  add_rule("aten._scaled_dot_product_flash_attention.default", attention_rule(causal_at({0, {}, {}, 1.0}, 4)));
  // ..._backward(grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
  //              is_causal, philox_seed, philox_offset, *, scale)
  add_rule("aten._scaled_dot_product_flash_attention_backward.default",
           attention_rule(causal_at({1, {}, {}, 2.5}, 11)));
  // _scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale)
  add_rule("aten._scaled_dot_product_efficient_attention.default",
           attention_rule(causal_at({0, {3}, {"attn_bias"}, 1.0}, 6)));
  // ..._backward(grad_out, q, k, v, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
  //              grad_input_mask, is_causal, *, scale)
  //              -> (grad_q, grad_k, grad_v, grad_bias)
  add_rule("aten._scaled_dot_product_efficient_attention_backward.default",
           attention_rule(causal_at({1, {4}, {"attn_bias"}, 2.5, 3}, 11)));
  // _scaled_dot_product_cudnn_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal,
  //                                     return_debug_mask, *, scale)
  add_rule("aten._scaled_dot_product_cudnn_attention.default",
           attention_rule(causal_at({0, {3}, {"attn_bias"}, 1.0}, 6)));
  // ..._backward(grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
  //              cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale)
  add_rule("aten._scaled_dot_product_cudnn_attention_backward.default",
           attention_rule(causal_at({1, {8}, {"attn_bias"}, 2.5}, 14)));
  // _scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, *, scale,
  //                                    enable_gqa) -> (out, attn_weights)
  add_rule("aten._scaled_dot_product_attention_math.default",
           attention_rule({0, {3, 6}, {"attn_mask", "dropout_mask"}, 1.0}));
}

}  // namespace autoshard
