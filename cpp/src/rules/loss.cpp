// Negative log-likelihood loss: nll_loss_forward / nll_loss_backward (cross_entropy is
// _log_softmax + nll_loss in ATen).
// nll_loss_forward(input[N,C] or [C], target[N], weight?, reduction, ignore_index)
//   -> (output, total_weight). Only non-class dims may be sharded (input and target together,
//   the class weight Replicate):
//   reduction=none (0): output follows the target's shard, total_weight R.
//   reduction=sum  (2): output and total_weight are P(sum) (sums of local sums).
//   reduction=mean (1): NO sharded row. The local op returns sum_local / total_weight_local,
//     and no placement turns those into sum_all / total_weight_all when ranks ignore different
//     numbers of targets (ignore_index, as GPT-2's shifted labels do) or carry different class
//     weights; DTensor's P(avg) row for it is wrong in exactly those cases (issue #185167).
// nll_loss_backward(grad_out, input, target, weight?, reduction, ignore_index, total_weight)
//   -> grad_input: exact when batch-sharded for every reduction, provided grad_out and
//   total_weight are the replicated global scalars (for none, grad_out follows the target).
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

constexpr int64_t kReductionNone = 0, kReductionMean = 1, kReductionSum = 2;

int class_dim(const TensorMeta& input) { return input.rank() >= 2 ? 1 : 0; }

std::vector<ShardingRow> nll_forward_rows(const RuleContext& ctx) {
  const TensorMeta& in = input_meta(ctx, 0);
  const int64_t reduction = int_arg(ctx, 3, "reduction", kReductionMean);
  if (reduction != kReductionNone && reduction != kReductionMean && reduction != kReductionSum)
    rule_error(ctx, "unknown reduction " + std::to_string(reduction) + " (expected 0, 1 or 2)");
  if (reduction == kReductionMean) return {};
  const int cdim = class_dim(in);
  std::vector<ShardingRow> rows;
  for (int d = 0; d < in.rank(); ++d) {
    if (d == cdim) continue;
    const int t = d < cdim ? d : d - 1;
    ShardingRow r = replicate_row(ctx);
    r.inputs[0] = S(d);
    r.inputs[1] = S(t);
    if (reduction == kReductionNone) {
      r.outputs[0] = S(t);
    } else {
      r.outputs[0] = P(ReduceOp::Sum);
      if (r.outputs.size() > 1) r.outputs[1] = P(ReduceOp::Sum);
    }
    rows.push_back(r);
  }
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> nll_backward_rows(const RuleContext& ctx) {
  const TensorMeta& in = input_meta(ctx, 1);
  const int64_t reduction = int_arg(ctx, 4, "reduction", kReductionMean);
  const int cdim = class_dim(in);
  std::vector<ShardingRow> rows;
  for (int d = 0; d < in.rank(); ++d) {
    if (d == cdim) continue;
    const int t = d < cdim ? d : d - 1;
    ShardingRow r = replicate_row(ctx);  // weight and total_weight stay R
    r.outputs[0] = S(d);
    r.inputs[0] = reduction == kReductionNone ? S(t) : R();
    r.inputs[1] = S(d);
    r.inputs[2] = S(t);
    rows.push_back(r);
  }
  return dedup_rows(std::move(rows));
}

}  // namespace

void register_loss_rules() {
  OpRule fwd;
  fwd.rows = nll_forward_rows;
  fwd.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  add_rule("aten.nll_loss_forward.default", fwd);
  OpRule bwd;
  bwd.rows = nll_backward_rows;
  bwd.flops = fwd.flops;
  add_rule("aten.nll_loss_backward.default", bwd);
}

}  // namespace autoshard
