// Normalisation: native_layer_norm, _fused_rms_norm and their backwards.
// The statistics run over the trailing `normalized_shape` dims, so only the leading (batch /
// sequence) dims may be sharded: activations, mean and rstd (which keep the input rank with
// size-1 normalised dims) share the shard, and the affine parameters stay Replicate. In the
// backward the parameter gradients sum over the leading dims, so they come out P(sum).
// No Partial input rows (normalisation is not linear) and no hidden-dim sharding (it would need
// a distributed mean/variance), as in DTensor.
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

// Number of leading (shardable) dims: rank - len(normalized_shape).
int leading_dims(const RuleContext& ctx, size_t normalized_shape_pos) {
  const int rank = input_meta(ctx, 0).rank();
  const int n = static_cast<int>(int_list_arg(ctx, normalized_shape_pos, "normalized_shape").size());
  if (n > rank) rule_error(ctx, "normalized_shape has more dims than the input");
  return rank - n;
}

// Forward: outputs (out, stats...) all S(d); input 0 S(d); weight / bias R.
std::vector<ShardingRow> norm_forward_rows(const RuleContext& ctx) {
  const int lead = leading_dims(ctx, 1);
  std::vector<ShardingRow> rows;
  for (int d = 0; d < lead; ++d) {
    ShardingRow r = replicate_row(ctx);
    for (auto& p : r.outputs) p = S(d);
    r.inputs[0] = S(d);
    rows.push_back(r);
  }
  return dedup_rows(std::move(rows));
}

// Backward: native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?,
// bias?, output_mask) -> (grad_input, grad_weight, grad_bias);
// _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight?, output_mask)
// -> (grad_input, grad_weight). Activation-shaped inputs (grad_out, input, mean/rstd) are the
// tensor inputs of the input's rank; parameters have rank len(normalized_shape).
std::vector<ShardingRow> norm_backward_rows(const RuleContext& ctx) {
  const int lead = leading_dims(ctx, 2);
  const int rank = input_meta(ctx, 0).rank();
  std::vector<ShardingRow> rows;
  for (int d = 0; d < lead; ++d) {
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(d);
    for (size_t o = 1; o < r.outputs.size(); ++o) r.outputs[o] = P(ReduceOp::Sum);
    for (size_t i = 0; i < ctx.inputs.size(); ++i) r.inputs[i] = ctx.inputs[i].rank() == rank ? S(d) : R();
    rows.push_back(r);
  }
  return dedup_rows(std::move(rows));
}

OpRule norm_rule(std::vector<ShardingRow> (*rows)(const RuleContext&)) {
  OpRule r;
  r.rows = rows;
  r.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  return r;
}

}  // namespace

void register_norm_rules() {
  add_rules({"aten.native_layer_norm.default", "aten._fused_rms_norm.default"}, norm_rule(norm_forward_rows));
  add_rules({"aten.native_layer_norm_backward.default", "aten._fused_rms_norm_backward.default"},
            norm_rule(norm_backward_rows));
}

}  // namespace autoshard
