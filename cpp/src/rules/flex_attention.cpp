// FlexAttention's higher-order ops, as the trace folds them (python/autoshard/ops/flex_attention.py):
//   higher_order.flex_attention(q, k, v, "score_mod", block_mask, scale, None, score_mod_buffers,
//                               mask_mod_buffers) -> (out, logsumexp, max_scores)
//   higher_order.flex_attention_backward(q, k, v, out, logsumexp, grad_out, grad_logsumexp,
//                                        "fw_graph", "joint_graph", block_mask, scale, None,
//                                        score_mod_buffers, mask_mod_buffers) -> (dq, dk, dv, None)
// block_mask = [Q_LEN, KV_LEN, kv_num_blocks, kv_indices, (full_kv_num_blocks, full_kv_indices,)
//               q_num_blocks, q_indices, (full_q_num_blocks, full_q_indices,) Q_BLOCK, KV_BLOCK, "mask_mod"]
// Like every attention, it is independent per (batch, head): two rows, shard dim 0 (batch) or
// dim 1 (heads) of every activation tensor ([B, H, S, D] and the [B, H, S] statistics)
// together. The kernels (and the dense math on CPU) index the block mask's [B, H, ...] tensors
// and call score_mod / mask_mod with the LOCAL batch and head indices, so:
// - a block-mask tensor follows the row on that dim where it has the full size, and is
//   Replicate where it broadcasts (size 1: one row serves every batch / head);
// - a tensor the mods capture (a buffer) is indexed by those local indices too: in the batch row
//   a buffer whose dim 0 has the batch size follows it (S(0): a per-sequence document id
//   table [B, S]); in the head row a 1-D buffer of the head count does (per-head slopes [H]);
//   every other buffer is read whole (R). (The graph JSON does not hold the mods themselves, so
//   a buffer is matched by its size; a mod that indexes a batch-sized dim other than dim 0 by
//   `b` is outside these rows.)
// No Partial rows beyond the sequence row's (a score_mod buffer's gradient, which would sum
// over ranks, is refused by the trace). A k/v that broadcasts over the batch (size 1, q's
// larger) gets dk/dv summed over the batch: no batch row.
// The sequence row (context parallelism, the all-gather-K/V recipe, as attention.cpp's): q and
// every other activation shard dim 2 (out, logsumexp, grad_out: the rank's queries), k and v
// Replicate (gathered whole); the backward's dk / dv are Partial(sum), this rank's queries'
// contributions. The mods see the rank's LOCAL query index, so the runtime calls them at the
// global positions its shard holds (ops/context_parallel.py, flex_attention.call_at_positions);
// the block mask's tensors and the mods' buffers are read whole (Replicate): they are indexed by
// position, and the runtime rebuilds the local block structure where a kernel reads it (GPU).
// `accept`: with GQA both head counts divide by the head shard count; no empty block; an even
// split of the query sequence (the positions of shard r start at r x local length).
// FLOPs: the dense 4*B*H*Sq*Skv*D (backward 2.5x) on local shapes; the block mask's sparsity
// (a causal mask skips about half the blocks on a GPU) is data, not in the graph.
// Every one of these runs on local shards in these rows (runtime: ops/local_run.py LOCAL_OPS).
#include <set>
#include <string>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

struct FlexSpec {
  size_t block_mask_arg;  // positional argument holding the block mask tuple
  double flop_factor;     // 1 forward, 2.5 backward
};

// The ctx.inputs index range [begin, end) of the block mask's tensors; the activations come
// before it, the mods' buffers after it.
struct InputRanges {
  int mask_begin = 0;
  int mask_end = 0;
};

InputRanges input_ranges(const RuleContext& ctx, const FlexSpec& spec) {
  InputRanges r;
  r.mask_begin = tensor_input_index(ctx, spec.block_mask_arg);
  if (r.mask_begin < 0 || spec.block_mask_arg >= ctx.node.args.size())
    rule_error(ctx, "the block mask argument holds no tensors");
  int count = 0;
  for (const ArgValue& a : ctx.node.args[spec.block_mask_arg].list) count += a.is_tensor() ? 1 : 0;
  r.mask_end = r.mask_begin + count;
  return r;
}

Placement mask_tensor_placement(const TensorMeta& q, const TensorMeta& m, int dim) {
  if (m.rank() <= dim || m.shape[dim] == 1 || m.shape[dim] != q.shape[dim]) return R();
  return S(dim);
}

Placement buffer_placement(const TensorMeta& q, const TensorMeta& buf, int dim) {
  if (dim == 0 && buf.rank() >= 1 && buf.shape[0] == q.shape[0] && q.shape[0] > 1) return S(0);
  if (dim == 1 && buf.rank() == 1 && buf.shape[0] == q.shape[1] && q.shape[1] > 1) return S(0);
  return R();
}

// The sequence row (the header): q, the other activations and the statistics shard their
// sequence dim 2, k and v (inputs 1, 2) are gathered whole, mask tensors and buffers are read
// whole; the backward's dk / dv (outputs 1, 2) are Partial sums.
ShardingRow flex_sequence_row(const RuleContext& ctx, const FlexSpec& spec, const InputRanges& ranges) {
  const bool backward = spec.block_mask_arg != 4;
  ShardingRow r = replicate_row(ctx);
  for (int i = 0; i < ranges.mask_begin; ++i)
    r.inputs[i] = (i == 1 || i == 2 || ctx.inputs[i].rank() < 3) ? R() : S(2);
  for (size_t o = 0; o < ctx.outputs.size(); ++o) {
    if (!ctx.outputs[o]) continue;
    if (backward && (o == 1 || o == 2))
      r.outputs[o] = P();
    else
      r.outputs[o] = ctx.outputs[o]->rank() >= 3 ? S(2) : R();
  }
  return r;
}

std::vector<ShardingRow> flex_rows(const RuleContext& ctx, const FlexSpec& spec) {
  const TensorMeta& q = input_meta(ctx, 0);
  const TensorMeta& k = input_meta(ctx, 1);
  if (q.rank() != 4 || k.rank() != 4) return {};
  const InputRanges ranges = input_ranges(ctx, spec);
  std::vector<ShardingRow> rows;
  for (int dim : {0, 1}) {
    if (dim == 0 && k.shape[0] != q.shape[0]) continue;  // k/v broadcast over the batch
    ShardingRow r = replicate_row(ctx);
    for (int i = 0; i < static_cast<int>(ctx.inputs.size()); ++i) {
      const TensorMeta& m = ctx.inputs[i];
      if (i < ranges.mask_begin)
        r.inputs[i] = m.rank() >= 3 ? S(dim) : R();
      else if (i < ranges.mask_end)
        r.inputs[i] = mask_tensor_placement(q, m, dim);
      else
        r.inputs[i] = buffer_placement(q, m, dim);
    }
    for (size_t o = 0; o < ctx.outputs.size(); ++o)
      if (ctx.outputs[o]) r.outputs[o] = ctx.outputs[o]->rank() >= 3 ? S(dim) : R();
    rows.push_back(r);
  }
  rows.push_back(flex_sequence_row(ctx, spec, ranges));
  return dedup_rows(std::move(rows));
}

bool flex_accept(const RuleContext& ctx, const FlexSpec& spec, const std::vector<Layout>& inputs) {
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    if (has_empty_shard(ctx.mesh, inputs.at(i), ctx.inputs[i])) return false;
  const InputRanges ranges = input_ranges(ctx, spec);
  const TensorMeta& q = ctx.inputs.at(0);
  if (q.rank() == 4 && !divides(q.shape[2], shards_on_dim(ctx.mesh, inputs.at(0), 2))) return false;
  std::set<int64_t> heads;
  for (int i = 0; i < ranges.mask_begin; ++i)
    if (ctx.inputs[i].rank() == 4) heads.insert(ctx.inputs[i].shape[1]);
  if (heads.size() <= 1) return true;
  for (int i = 0; i < ranges.mask_begin; ++i) {
    if (ctx.inputs[i].rank() != 4) continue;
    const int64_t n = shards_on_dim(ctx.mesh, inputs.at(i), 1);
    for (int64_t h : heads)
      if (!divides(h, n)) return false;
  }
  return true;
}

double flex_flops(const std::vector<TensorMeta>& in, const FlexSpec& spec) {
  const TensorMeta& q = in.at(0);
  const TensorMeta& k = in.at(1);
  if (q.rank() != 4 || k.rank() != 4) return 0;
  double b = q.shape[0], h = q.shape[1], sq = q.shape[2], d = q.shape[3], skv = k.shape[2];
  return spec.flop_factor * 4.0 * b * h * sq * skv * d;
}

OpRule flex_rule(FlexSpec spec) {
  OpRule r;
  r.rows = [spec](const RuleContext& ctx) { return flex_rows(ctx, spec); };
  r.accept = [spec](const RuleContext& ctx, const std::vector<Layout>&, const std::vector<Layout>& ins) {
    return flex_accept(ctx, spec, ins);
  };
  r.flops = [spec](const RuleContext&, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) {
    return flex_flops(in, spec);
  };
  return r;
}

}  // namespace

void register_flex_attention_rules() {
  add_rule("higher_order.flex_attention", flex_rule({4, 1.0}));
  add_rule("higher_order.flex_attention_backward", flex_rule({9, 2.5}));
}

}  // namespace autoshard
