// Losses: the negative log-likelihood loss (nll_loss_forward / nll_loss_backward;
// cross_entropy is _log_softmax + nll_loss in ATen, label smoothing adds a sum of the
// log-probs) and the elementwise losses (mse, smooth-l1, huber, binary cross-entropy with and
// without logits). l1_loss and kl_div have no ATen op of their own (they trace as pointwise
// ops and reductions).
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
//
// Elementwise losses loss(self, target, [weight, pos_weight,] reduction, [beta|delta]): every
// input is read at self's position (weight / pos_weight broadcast to it), so any dim of self
// may be sharded, each input on the dim feeding it (R where broadcast):
//   reduction=none: the output follows the shard; sum: output P(sum); mean: output P(avg),
//   `accept`ing only evenly divided shards (local means of unequal blocks do not average to
//   the mean). No Partial inputs (the losses are not linear).
// Their backwards loss_backward(grad_out, self, target, [weight,] reduction, ...) -> grad_self:
//   none and sum: grad_self follows the shard of self (grad_out: the same shard for none, the
//   replicated scalar for sum). mean: NO shard row - the local kernel divides by the LOCAL
//   element count (trace.py rewrites mean losses as sum / count, so graphs from autoshard's
//   tracer carry the sum form). Every reduction: linear in grad_out, [P(s) | P(s), R...].
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

// Position of the `reduction` argument of each elementwise loss (forward and backward).
size_t reduction_pos(const std::string& op) {
  if (op == "aten.binary_cross_entropy_with_logits.default") return 4;
  if (op == "aten.binary_cross_entropy.default" || op == "aten.mse_loss_backward.default" ||
      op == "aten.smooth_l1_loss_backward.default" || op == "aten.huber_loss_backward.default")
    return 3;
  if (op == "aten.binary_cross_entropy_backward.default") return 4;
  return 2;  // mse_loss, smooth_l1_loss, huber_loss
}

int64_t loss_reduction(const RuleContext& ctx) {
  const int64_t r = int_arg(ctx, reduction_pos(ctx.node.op), "reduction", kReductionMean);
  if (r != kReductionNone && r != kReductionMean && r != kReductionSum)
    rule_error(ctx, "unknown reduction " + std::to_string(r) + " (expected 0, 1 or 2)");
  return r;
}

// Rows sharding every tensor input on the dim of `ref` (a tensor input) that feeds it.
std::vector<ShardingRow> elementwise_rows(const RuleContext& ctx, int ref, Placement out_of_dim, bool out_follows) {
  const TensorMeta& self = input_meta(ctx, ref);
  std::vector<ShardingRow> rows;
  for (const TensorMeta& m : ctx.inputs)
    if (m.rank() > self.rank()) return rows;  // self is not the broadcast shape: keep it whole
  for (int d = 0; d < self.rank(); ++d) {
    ShardingRow r = replicate_row(ctx);
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      const int src = broadcast_source_dim(self.shape, d, ctx.inputs[i].shape);
      r.inputs[i] = src >= 0 ? S(src) : R();
    }
    r.outputs[0] = out_follows ? S(d) : out_of_dim;
    rows.push_back(r);
  }
  return rows;
}

std::vector<ShardingRow> elementwise_loss_rows(const RuleContext& ctx) {
  const int64_t reduction = loss_reduction(ctx);
  if (reduction == kReductionNone) return dedup_rows(elementwise_rows(ctx, 0, R(), true));
  const ReduceOp kind = reduction == kReductionSum ? ReduceOp::Sum : ReduceOp::Avg;
  return dedup_rows(elementwise_rows(ctx, 0, P(kind), false));
}

// mean: the local means average to the global mean only over equal blocks.
bool elementwise_loss_accept(const RuleContext& ctx, const std::vector<Layout>&, const std::vector<Layout>& ins) {
  if (loss_reduction(ctx) != kReductionMean) return true;
  const TensorMeta& self = input_meta(ctx, 0);
  for (int d = 0; d < self.rank(); ++d)
    if (!divides(self.shape[d], shards_on_dim(ctx.mesh, ins.at(0), d))) return false;
  return true;
}

std::vector<ShardingRow> elementwise_loss_backward_rows(const RuleContext& ctx) {
  const int64_t reduction = loss_reduction(ctx);
  std::vector<ShardingRow> rows;
  // grad_self has self's shape; grad_out is either that shape (none) or a scalar (R)
  if (reduction != kReductionMean) rows = elementwise_rows(ctx, 1, R(), true);
  add_partial_first_input_rows(rows, ctx);
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

  OpRule elementwise;
  elementwise.rows = elementwise_loss_rows;
  elementwise.accept = elementwise_loss_accept;
  elementwise.flops = fwd.flops;
  add_rules({"aten.mse_loss.default", "aten.smooth_l1_loss.default", "aten.huber_loss.default",
             "aten.binary_cross_entropy.default", "aten.binary_cross_entropy_with_logits.default"},
            elementwise);
  OpRule elementwise_bwd;
  elementwise_bwd.rows = elementwise_loss_backward_rows;
  elementwise_bwd.flops = fwd.flops;
  add_rules({"aten.mse_loss_backward.default", "aten.smooth_l1_loss_backward.default",
             "aten.huber_loss_backward.default", "aten.binary_cross_entropy_backward.default"},
            elementwise_bwd);
}

}  // namespace autoshard
