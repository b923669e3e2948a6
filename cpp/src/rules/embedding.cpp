// Embedding lookup and its dense backward.
// embedding(weight[V,D], indices[*], padding_idx, scale_grad_by_freq, sparse) -> out[*, D]:
//   [S(rank(indices)) | S(1), R]  (embedding dim sharded: column-parallel table)
//   [S(i) | R, S(i)]              for every indices dim i (batch / sequence sharded)
//   The vocab-sharded table (S(0)) needs DTensor's _MaskPartial (mask out-of-range ids, then
//   reduce); the runtime does not support it yet, so that row is deliberately left out.
// embedding_dense_backward(grad[*, D], indices[*], num_weights, padding_idx,
//   scale_grad_by_freq) -> grad_weight[V, D]:
//   [S(1) | S(rank(grad)-1), R];  [P(sum) | S(i), S(i)] for every indices dim i;
//   [P(sum) | P(sum), R]. With scale_grad_by_freq the gradient is divided by each id's count
//   over the WHOLE batch, which a rank holding part of the batch cannot know, so the batch rows
//   are dropped in that case.
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

std::vector<ShardingRow> embedding_rows(const RuleContext& ctx) {
  const TensorMeta& weight = input_meta(ctx, 0);
  const TensorMeta& idx = input_meta(ctx, 1);
  if (weight.rank() != 2) rule_error(ctx, "the embedding table must be 2-D");
  std::vector<ShardingRow> rows;
  rows.push_back({{S(idx.rank())}, {S(1), R()}});
  for (int i = 0; i < idx.rank(); ++i) rows.push_back({{S(i)}, {R(), S(i)}});
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> embedding_backward_rows(const RuleContext& ctx) {
  const TensorMeta& grad = input_meta(ctx, 0);
  const TensorMeta& idx = input_meta(ctx, 1);
  const bool scale_by_freq = bool_arg(ctx, 4, "scale_grad_by_freq", false);
  std::vector<ShardingRow> rows;
  rows.push_back({{S(1)}, {S(grad.rank() - 1), R()}});
  if (!scale_by_freq)
    for (int i = 0; i < idx.rank(); ++i) rows.push_back({{P(ReduceOp::Sum)}, {S(i), S(i)}});
  rows.push_back({{P(ReduceOp::Sum)}, {P(ReduceOp::Sum), R()}});
  return dedup_rows(std::move(rows));
}

}  // namespace

void register_embedding_rules() {
  OpRule fwd;
  fwd.rows = embedding_rows;
  fwd.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  add_rule("aten.embedding.default", fwd);
  OpRule bwd;
  bwd.rows = embedding_backward_rows;
  bwd.flops = fwd.flops;
  add_rule("aten.embedding_dense_backward.default", bwd);
}

}  // namespace autoshard
