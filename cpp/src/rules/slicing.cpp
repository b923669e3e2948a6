// Slicing, splitting and joining: select, slice (+ their backwards and their scatter forms
// select_scatter / slice_scatter), split, split_with_sizes, unbind, cat, stack,
// constant_pad_nd, tril/triu.
// Rule: any dim the op does not cut, join or pad may stay sharded (renumbered where a dim
// appears or vanishes); every Partial kind passes through (each op only moves values or writes
// zeros, which are neutral for sum/avg and identical on all ranks for max/min), except padding
// with a non-zero value, which keeps only avg/max/min.
#include <algorithm>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

void add_partials(std::vector<ShardingRow>& rows, const RuleContext& ctx,
                  std::initializer_list<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
  for (ReduceOp op : ops) rows.push_back(uniform_row(ctx, P(op)));
}

// Shard rows of a single-tensor-input op: input dim d -> output dim map(d) (-1: not shardable);
// every tensor output gets the same placement.
template <class Map>
std::vector<ShardingRow> shard_rows_by_input_dim(const RuleContext& ctx, int in_rank, Map map) {
  std::vector<ShardingRow> rows;
  for (int d = 0; d < in_rank; ++d) {
    int o = map(d);
    if (o < 0) continue;
    ShardingRow r = replicate_row(ctx);
    for (auto& p : r.outputs) p = S(o);
    r.inputs[0] = S(d);
    rows.push_back(r);
  }
  return rows;
}

std::vector<ShardingRow> select_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim"), rank);
  auto rows = shard_rows_by_input_dim(ctx, rank, [&](int d) { return d == dim ? -1 : (d < dim ? d : d - 1); });
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> slice_rows(const RuleContext& ctx) {
  const auto& in = input_meta(ctx, 0).shape;
  const int rank = static_cast<int>(in.size());
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim", 0), rank);
  const int64_t start = int_arg(ctx, 2, "start", 0);
  const int64_t end = int_arg(ctx, 3, "end", INT64_MAX);
  const int64_t step = int_arg(ctx, 4, "step", 1);
  const bool full = rank > 0 && step == 1 && (start == 0 || start <= -in[dim]) && end >= in[dim];
  auto rows = shard_rows_by_input_dim(ctx, rank, [&](int d) { return d == dim && !full ? -1 : d; });
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

// select_backward(grad, input_sizes, dim, index): grad gains the selected dim back.
std::vector<ShardingRow> select_backward_rows(const RuleContext& ctx) {
  const int out_rank = output_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 2, "dim"), out_rank);
  auto rows = shard_rows_by_input_dim(ctx, input_meta(ctx, 0).rank(), [&](int d) { return d < dim ? d : d + 1; });
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

// slice_backward(grad, input_sizes, dim, start, end, step): zero-pads the sliced dim back.
std::vector<ShardingRow> slice_backward_rows(const RuleContext& ctx) {
  const int rank = output_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 2, "dim"), rank);
  const bool same = input_meta(ctx, 0).shape == output_meta(ctx, 0).shape;
  auto rows = shard_rows_by_input_dim(ctx, rank, [&](int d) { return d == dim && !same ? -1 : d; });
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

// select_scatter(self, src, dim, index): self with self.select(dim, index) replaced by src
// (src lacks dim). Any other dim may be sharded in both (renumbered in src); every Partial
// kind passes when self and src carry the same one (each output element is one of them).
std::vector<ShardingRow> select_scatter_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 2, "dim"), rank);
  std::vector<ShardingRow> rows;
  for (int d = 0; d < rank; ++d)
    if (d != dim) rows.push_back({{S(d)}, {S(d), S(d < dim ? d : d - 1)}});
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

// slice_scatter(self, src, dim, start, end, step): src (same rank) replaces a slice of dim.
// Other dims may be sharded where self and src agree in size (also dim when src covers it).
std::vector<ShardingRow> slice_scatter_rows(const RuleContext& ctx) {
  const TensorMeta& self = input_meta(ctx, 0);
  const TensorMeta& src = input_meta(ctx, 1);
  const int rank = self.rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 2, "dim", 0), rank);
  std::vector<ShardingRow> rows;
  if (src.rank() == rank)
    for (int d = 0; d < rank; ++d)
      if ((d != dim || self.shape == src.shape) && src.shape[d] == self.shape[d])
        rows.push_back({{S(d)}, {S(d), S(d)}});
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

// split.Tensor(x, split_size, dim) / split_with_sizes(x, sizes, dim): outputs are pieces of dim.
std::vector<ShardingRow> split_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 2, "dim", 0), rank);
  auto rows = shard_rows_by_input_dim(ctx, rank, [&](int d) { return d == dim ? -1 : d; });
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> unbind_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim", 0), rank);
  auto rows = shard_rows_by_input_dim(ctx, rank, [&](int d) { return d == dim ? -1 : (d < dim ? d : d - 1); });
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

// A legacy empty 1-D input of cat ("torch.cat([torch.tensor([]), x])") has no dims to shard.
bool is_legacy_empty(const TensorMeta& m, int out_rank) { return m.rank() == 1 && m.shape[0] == 0 && out_rank != 1; }

std::vector<ShardingRow> cat_rows(const RuleContext& ctx) {
  const int rank = output_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim", 0), rank);
  std::vector<ShardingRow> rows;
  for (int d = 0; d < rank; ++d) {
    if (d == dim) continue;
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(d);
    for (size_t i = 0; i < ctx.inputs.size(); ++i) r.inputs[i] = is_legacy_empty(ctx.inputs[i], rank) ? R() : S(d);
    rows.push_back(r);
  }
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> stack_rows(const RuleContext& ctx) {
  const int out_rank = output_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim", 0), out_rank);
  std::vector<ShardingRow> rows;
  for (int d = 0; d + 1 < out_rank; ++d) {
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(d < dim ? d : d + 1);
    for (auto& p : r.inputs) p = S(d);
    rows.push_back(r);
  }
  add_partials(rows, ctx);
  return dedup_rows(std::move(rows));
}

// constant_pad_nd(x, pad, value): pad = [last_lo, last_hi, prev_lo, prev_hi, ...].
std::vector<ShardingRow> pad_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  std::vector<int64_t> pad = int_list_arg(ctx, 1, "pad");
  const double value = number_arg(ctx, 2, "value", 0.0);
  std::vector<bool> padded(rank, false);
  bool any = false;
  for (size_t k = 0; k < pad.size(); ++k) {
    int d = rank - 1 - static_cast<int>(k / 2);
    if (d >= 0 && pad[k] != 0) {
      padded[d] = true;
      any = true;
    }
  }
  auto rows = shard_rows_by_input_dim(ctx, rank, [&](int d) { return padded[d] ? -1 : d; });
  if (!any || value == 0.0)
    add_partials(rows, ctx);
  else
    add_partials(rows, ctx, {ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min});
  return dedup_rows(std::move(rows));
}

// tril / triu: DTensor only runs them replicated, so the framework's all-R row is the only one.
std::vector<ShardingRow> no_rows(const RuleContext&) { return {}; }

}  // namespace

void register_slicing_rules() {
  add_rule("aten.select.int", memory_bound_rule(select_rows, true));
  add_rule("aten.slice.Tensor", memory_bound_rule(slice_rows, true));
  add_rule("aten.select_backward.default", memory_bound_rule(select_backward_rows, false));
  add_rule("aten.slice_backward.default", memory_bound_rule(slice_backward_rows, false));
  add_rule("aten.select_scatter.default", memory_bound_rule(select_scatter_rows, false));
  add_rule("aten.slice_scatter.default", memory_bound_rule(slice_scatter_rows, false));
  add_rules({"aten.split.Tensor", "aten.split_with_sizes.default"}, memory_bound_rule(split_rows, true));
  add_rule("aten.unbind.int", memory_bound_rule(unbind_rows, true));
  add_rule("aten.cat.default", memory_bound_rule(cat_rows, false));
  add_rule("aten.stack.default", memory_bound_rule(stack_rows, false));
  add_rule("aten.constant_pad_nd.default", memory_bound_rule(pad_rows, false));
  add_rules({"aten.tril.default", "aten.triu.default"}, memory_bound_rule(no_rows, false));
}

}  // namespace autoshard
