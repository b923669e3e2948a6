// Reductions and scans: sum, mean, amax, amin, all/any, argmax/argmin, max.dim/min.dim,
// logsumexp, cumsum, topk, sort.
//   - a kept dim may stay sharded (renumbered when keepdim=False);
//   - a sharded reduced dim gives the matching Partial: sum -> P(sum), amax -> P(max),
//     amin -> P(min), mean -> P(avg). P(avg) of local means is the global mean only when every
//     rank holds the same number of elements, so mean's `accept` rejects a strategy whose
//     reduced dims are not evenly divided (DTensor bug #162692);
//   - a Partial input of the same kind passes through (sum of P(sum), mean of P(avg), amax of
//     P(max), amin of P(min));
//   - with a dtype cast (sum(x, dtype=int32), cumsum(x, dtype=int32)) only the Partial kinds
//     that commute with the cast: truncating each rank's partial float sum to an integer is
//     not the truncation of the total (MoE routing: cumsum over histc counts);
//   - index-returning, boolean and non-linear reductions (argmax, max.dim, all/any, logsumexp)
//     and order-dependent ops (sort, topk, cumsum's dim) only keep shards off the active dim.
#include <algorithm>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

struct ReductionSpec {
  size_t dims_pos;  // schema position of the dims argument (SIZE_MAX: reduces all)
  const char* dims_name;
  size_t keepdim_pos;               // SIZE_MAX: no keepdim argument (false)
  std::optional<ReduceOp> partial;  // nullopt: no Partial rows
};

std::vector<ShardingRow> reduction_rows(const RuleContext& ctx, const ReductionSpec& spec) {
  const TensorMeta& in = input_meta(ctx, 0);
  const int rank = in.rank();
  const ArgValue* dims_arg = spec.dims_pos == SIZE_MAX ? nullptr : find_arg(ctx, spec.dims_pos, spec.dims_name);
  const std::vector<int> red = reduction_dims(ctx, dims_arg, rank);
  const bool keepdim = spec.keepdim_pos != SIZE_MAX && bool_arg(ctx, spec.keepdim_pos, "keepdim", false);
  // a bool input's sum is a count (exact in any integer type); otherwise the Partial must
  // survive the output cast
  const bool partial_ok = spec.partial && (in.dtype == DType::Bool ||
                                           partial_survives_cast(*spec.partial, in.dtype, output_meta(ctx, 0).dtype));
  std::vector<ShardingRow> rows;
  int kept_index = 0;
  for (int d = 0; d < rank; ++d) {
    const bool reduced = std::binary_search(red.begin(), red.end(), d);
    ShardingRow r = replicate_row(ctx);
    r.inputs[0] = S(d);
    if (!reduced) {
      for (auto& p : r.outputs) p = S(keepdim ? d : kept_index);
      ++kept_index;
    } else if (partial_ok) {
      for (auto& p : r.outputs) p = P(*spec.partial);
    } else {
      continue;
    }
    rows.push_back(r);
  }
  // A Partial input of the reduction's own kind passes through (not for bool inputs, whose
  // "sum" is a count).
  if (partial_ok && in.dtype != DType::Bool) rows.push_back(uniform_row(ctx, P(*spec.partial)));
  return dedup_rows(std::move(rows));
}

bool mean_accept(const RuleContext& ctx, const std::vector<Layout>& outputs, const std::vector<Layout>& inputs) {
  const TensorMeta& in = input_meta(ctx, 0);
  const ArgValue* dims_arg = ctx.node.op == "aten.mean.default" ? nullptr : find_arg(ctx, 1, "dim");
  for (int d : reduction_dims(ctx, dims_arg, in.rank()))
    if (!divides(in.shape[d], shards_on_dim(ctx.mesh, inputs.at(0), d))) return false;
  return true;
}

// max/min over an empty block is undefined (torch raises), so a rank must not get one.
bool no_empty_input_block(const RuleContext& ctx, const std::vector<Layout>&, const std::vector<Layout>& inputs) {
  return !has_empty_shard(ctx.mesh, inputs.at(0), input_meta(ctx, 0));
}

OpRule reduction_rule(ReductionSpec spec) {
  OpRule r;
  r.rows = [spec](const RuleContext& ctx) { return reduction_rows(ctx, spec); };
  r.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  return r;
}

// Ops acting along one dim (scan / sort / select-k): shard any other dim, for every output.
std::vector<ShardingRow> along_dim_rows(const RuleContext& ctx, size_t dim_pos, int64_t dflt_dim,
                                        std::initializer_list<ReduceOp> partials) {
  const int rank = input_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, dim_pos, "dim", dflt_dim), rank);
  std::vector<ShardingRow> rows;
  for (int d = 0; d < rank; ++d) {
    if (d == dim) continue;
    ShardingRow r = replicate_row(ctx);
    r.inputs[0] = S(d);
    for (auto& p : r.outputs) p = S(d);
    rows.push_back(r);
  }
  for (ReduceOp op : partials) rows.push_back(uniform_row(ctx, P(op)));
  return dedup_rows(std::move(rows));
}

OpRule along_dim_rule(size_t dim_pos, int64_t dflt_dim, std::initializer_list<ReduceOp> partials = {}) {
  std::vector<ReduceOp> ps(partials);
  OpRule r;
  r.rows = [=](const RuleContext& ctx) {
    std::vector<ShardingRow> rows = along_dim_rows(ctx, dim_pos, dflt_dim, {});
    const DType from = input_meta(ctx, 0).dtype, to = output_meta(ctx, 0).dtype;
    for (ReduceOp op : ps)  // cumsum(x, dtype=...): only Partials that survive the cast
      if (from != DType::Bool && partial_survives_cast(op, from, to)) rows.push_back(uniform_row(ctx, P(op)));
    return dedup_rows(std::move(rows));
  };
  r.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  return r;
}

// argmax / argmin(x, dim=None, keepdim=False): without a dim the result indexes the flattened
// tensor, so only replication is correct.
std::vector<ShardingRow> arg_reduction_rows(const RuleContext& ctx) {
  if (!find_arg(ctx, 1, "dim")) return {};
  return reduction_rows(ctx, ReductionSpec{1, "dim", 2, std::nullopt});
}

}  // namespace

void register_reduction_rules() {
  add_rule("aten.sum.default", reduction_rule({SIZE_MAX, nullptr, SIZE_MAX, ReduceOp::Sum}));
  add_rule("aten.sum.dim_IntList", reduction_rule({1, "dim", 2, ReduceOp::Sum}));
  OpRule mean_all = reduction_rule({SIZE_MAX, nullptr, SIZE_MAX, ReduceOp::Avg});
  mean_all.accept = mean_accept;
  add_rule("aten.mean.default", mean_all);
  OpRule mean_dim = reduction_rule({1, "dim", 2, ReduceOp::Avg});
  mean_dim.accept = mean_accept;
  add_rule("aten.mean.dim", mean_dim);
  OpRule amax = reduction_rule({1, "dim", 2, ReduceOp::Max});
  amax.accept = no_empty_input_block;
  add_rule("aten.amax.default", amax);
  OpRule amin = reduction_rule({1, "dim", 2, ReduceOp::Min});
  amin.accept = no_empty_input_block;
  add_rule("aten.amin.default", amin);
  add_rules({"aten.all.default", "aten.any.default"}, reduction_rule({SIZE_MAX, nullptr, SIZE_MAX, std::nullopt}));
  add_rules({"aten.all.dim", "aten.any.dim", "aten.all.dims", "aten.any.dims", "aten.logsumexp.default", "aten.max.dim",
             "aten.min.dim"},
            reduction_rule({1, "dim", 2, std::nullopt}));
  OpRule argred;
  argred.rows = arg_reduction_rows;
  argred.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  add_rules({"aten.argmax.default", "aten.argmin.default"}, argred);
  add_rule("aten.cumsum.default", along_dim_rule(1, 0, {ReduceOp::Sum, ReduceOp::Avg}));
  add_rule("aten.topk.default", along_dim_rule(2, -1));
  add_rules({"aten.sort.default", "aten.sort.stable"}, along_dim_rule(1, -1));
}

}  // namespace autoshard
