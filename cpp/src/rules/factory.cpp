// Factory ops.
//   Input-less factories (zeros, ones, full, empty, empty_strided, scalar_tensor, arange, rand,
//   randn): Replicate only for now (DTensor needs a DTensor input to run an op; the runtime
//   would have to build sharded factories itself, e.g. torch.distributed.tensor.zeros).
//   *_like(x): the result has x's shape, so it may follow x's shard; its values do not depend
//   on x, so a Partial x gives a Replicate result without communication ([R | P(r)]).
//   empty_like / new_empty / new_empty_strided: uninitialised, so the result may also inherit
//   any Partial (the values are overwritten before use; DTensor PR #180511).
//   new_zeros / new_ones / new_full: a constant must never be Partial (P(sum) of c on n ranks
//   reads as n*c); a sharded input gives a sharded result only when the shapes agree,
//   otherwise the result is Replicate.
//   fill.Scalar(x, v): constant v: shard rows and Partial avg/max/min (never sum).
//   fill.Tensor(x, v[0-d]): the result is v everywhere, so it follows x's shard with v R, is
//   Partial wherever v is (any kind; x's values are not read: R or the same Partial), and R
//   from a Partial x with v R.
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

std::vector<ShardingRow> no_rows(const RuleContext&) { return {}; }

// For ops with one tensor input `x` and one output. `same_shape_shard`: output follows a shard
// of x when their shapes agree (else R). `partial_to_replicate`: [R | P(r)] rows.
// `inherit_partial`: [P(r) | P(r)] rows for the given kinds.
std::vector<ShardingRow> factory_like_rows(const RuleContext& ctx, bool partial_to_replicate,
                                           std::vector<ReduceOp> inherit_partial) {
  const TensorMeta& x = input_meta(ctx, 0);
  const TensorMeta& out = output_meta(ctx, 0);
  const bool same = x.shape == out.shape;
  std::vector<ShardingRow> rows;
  for (int d = 0; d < x.rank(); ++d) rows.push_back({{same ? S(d) : R()}, {S(d)}});
  if (partial_to_replicate)
    for (ReduceOp op : kAllReduceOps) rows.push_back({{R()}, {P(op)}});
  if (same || ctx.node.op.find("new_empty") == std::string::npos)
    for (ReduceOp op : inherit_partial) rows.push_back({{P(op)}, {P(op)}});
  else
    for (ReduceOp op : inherit_partial) rows.push_back({{R()}, {P(op)}});
  // `rows` may hold [R | S(d)] rows (shape change): valid, the result is a fresh replicated
  // tensor, and the framework keeps them (only all-R rows are implicit).
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> fill_tensor_rows(const RuleContext& ctx) {
  if (ctx.inputs.size() != 2) rule_error(ctx, "expected a tensor and a 0-d value tensor");
  std::vector<ShardingRow> rows;
  for (int d = 0; d < input_meta(ctx, 0).rank(); ++d) rows.push_back({{S(d)}, {S(d), R()}});
  for (ReduceOp op : kAllReduceOps) {
    rows.push_back({{P(op)}, {R(), P(op)}});
    rows.push_back({{P(op)}, {P(op), P(op)}});
    rows.push_back({{R()}, {P(op), R()}});
  }
  return dedup_rows(std::move(rows));
}

}  // namespace

void register_factory_rules() {
  add_rules({"aten.zeros.default", "aten.ones.default", "aten.full.default", "aten.empty.memory_format",
             "aten.empty_strided.default", "aten.scalar_tensor.default", "aten.arange.default", "aten.arange.start",
             "aten.arange.start_step", "aten.rand.default", "aten.randn.default", "aten._assert_async.msg"},
            memory_bound_rule(no_rows));
  add_rules({"aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default", "aten.rand_like.default",
             "aten.randn_like.default"},
            memory_bound_rule([](const RuleContext& ctx) { return factory_like_rows(ctx, true, {}); }));
  add_rules({"aten.empty_like.default", "aten.new_empty.default", "aten.new_empty_strided.default"},
            memory_bound_rule([](const RuleContext& ctx) {
              return factory_like_rows(ctx, false, {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min});
            }));
  add_rules({"aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default"},
            memory_bound_rule([](const RuleContext& ctx) { return factory_like_rows(ctx, true, {}); }));
  add_rules({"aten.fill.Scalar"}, memory_bound_rule([](const RuleContext& ctx) {
              return factory_like_rows(ctx, false, {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min});
            }));
  add_rule("aten.fill.Tensor", memory_bound_rule(fill_tensor_rows));
}

}  // namespace autoshard
