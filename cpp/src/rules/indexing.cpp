// Index-driven ops: index_select, gather, scatter / scatter_add, index_add, index.Tensor,
// index_put. Index tensors hold GLOBAL positions, so the dim they index into can never be
// sharded in the indexed tensor (a rank would read or write its local block with global
// offsets); other dims may be sharded where every tensor has that dim at the same size.
//   index_select(x, dim, idx): [S(d) | S(d), R] d != dim; [S(dim) | R, S(0)] (split the ids);
//     [P(r) | P(r), R] for every r (a selection of partial values is partial).
//   gather(x, dim, idx): [S(dim) | R, S(dim)] (split the ids along dim); [S(d) | S(d), S(d)]
//     for d != dim only where x and idx have the same size on d (DTensor checks only the rank).
//   scatter(self, dim, idx, src) / scatter.value / scatter_add: [S(d) | S(d), S(d), S(d)] for
//     d != dim where self, idx and src agree on d.
//   index_add(self, dim, idx, src, alpha): [S(d) | S(d), R, S(d)] d != dim;
//     [P(sum) | P(sum), R, P(sum)] (linear in self and src).
//   index.Tensor(x, [idx...]): x sharded on a non-indexed dim (ids R), or all ids sharded on
//     one dim of their broadcast shape (x R); [P(s) | P(s), R...] for s in {sum, avg}.
//   index_put(self, [idx...], values, accumulate): self sharded on a non-indexed dim with the
//     values on the matching dim (R where broadcast), ids R; [P(sum) | P(sum), R..., P(sum)].
#include <algorithm>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

std::vector<ShardingRow> index_select_rows(const RuleContext& ctx) {
  const TensorMeta& x = input_meta(ctx, 0);
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim"), x.rank());
  std::vector<ShardingRow> rows;
  for (int d = 0; d < x.rank(); ++d)
    if (d != dim) rows.push_back({{S(d)}, {S(d), R()}});
  if (input_meta(ctx, 1).rank() == 1) rows.push_back({{S(dim)}, {R(), S(0)}});
  for (ReduceOp op : kAllReduceOps) rows.push_back({{P(op)}, {P(op), R()}});
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> gather_rows(const RuleContext& ctx) {
  const TensorMeta& x = input_meta(ctx, 0);
  const TensorMeta& idx = input_meta(ctx, 1);
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim"), x.rank());
  std::vector<ShardingRow> rows;
  if (idx.rank() == x.rank()) {
    rows.push_back({{S(dim)}, {R(), S(dim)}});
    for (int d = 0; d < x.rank(); ++d)
      if (d != dim && x.shape[d] == idx.shape[d]) rows.push_back({{S(d)}, {S(d), S(d)}});
  }
  return dedup_rows(std::move(rows));
}

// scatter.src(self, dim, index, src), scatter.value(self, dim, index, value), scatter_add.
std::vector<ShardingRow> scatter_rows(const RuleContext& ctx) {
  const TensorMeta& self = input_meta(ctx, 0);
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim"), self.rank());
  std::vector<ShardingRow> rows;
  for (int d = 0; d < self.rank(); ++d) {
    if (d == dim) continue;
    bool agree = true;
    for (const TensorMeta& m : ctx.inputs) agree = agree && m.rank() == self.rank() && m.shape[d] == self.shape[d];
    if (agree) rows.push_back(uniform_row(ctx, S(d)));
  }
  return dedup_rows(std::move(rows));
}

// index_add(self, dim, index, source, alpha)
std::vector<ShardingRow> index_add_rows(const RuleContext& ctx) {
  const TensorMeta& self = input_meta(ctx, 0);
  const TensorMeta& src = input_meta(ctx, 2);
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim"), self.rank());
  std::vector<ShardingRow> rows;
  if (src.rank() == self.rank())
    for (int d = 0; d < self.rank(); ++d)
      if (d != dim && src.shape[d] == self.shape[d]) rows.push_back({{S(d)}, {S(d), R(), S(d)}});
  rows.push_back({{P(ReduceOp::Sum)}, {P(ReduceOp::Sum), R(), P(ReduceOp::Sum)}});
  return dedup_rows(std::move(rows));
}

// Advanced indexing layout: which x dims are indexed, and where the broadcast index dims and
// the remaining x dims land in the result.
struct AdvancedIndex {
  std::vector<bool> indexed;       // per x dim
  std::vector<int> index_inputs;   // tensor-input index of each non-None index, in order
  std::vector<int> index_dims_of;  // per non-None index: its x dim
  int broadcast_rank = 0;          // rank of the broadcast index shape
  std::vector<int64_t> broadcast_shape;
  int first_index_out = 0;        // output dim where the broadcast index dims start
  std::vector<int> out_dim_of_x;  // per x dim: output dim, -1 if indexed
  bool data_dependent = false;    // a boolean mask index: result shape depends on values
};

AdvancedIndex advanced_index(const RuleContext& ctx, int x_rank, int first_index_input) {
  AdvancedIndex ai;
  ai.indexed.assign(x_rank, false);
  const ArgValue* list = find_arg(ctx, 1, "indices");
  if (!list || list->kind != ArgValue::Kind::List) rule_error(ctx, "expected a list of index tensors");
  int next = first_index_input;
  for (size_t k = 0; k < list->list.size(); ++k) {
    const ArgValue& e = list->list[k];
    if (e.kind == ArgValue::Kind::None) continue;
    if (!e.is_tensor()) rule_error(ctx, "index list entries must be tensors or None");
    if (static_cast<int>(k) >= x_rank) rule_error(ctx, "too many indices for the tensor");
    if (input_meta(ctx, next).dtype == DType::Bool) ai.data_dependent = true;
    ai.indexed[k] = true;
    ai.index_inputs.push_back(next);
    ai.index_dims_of.push_back(static_cast<int>(k));
    ++next;
  }
  for (int i : ai.index_inputs) ai.broadcast_rank = std::max(ai.broadcast_rank, input_meta(ctx, i).rank());
  ai.broadcast_shape.assign(ai.broadcast_rank, 1);
  for (int i : ai.index_inputs) {
    const auto& s = input_meta(ctx, i).shape;
    int off = ai.broadcast_rank - static_cast<int>(s.size());
    for (size_t d = 0; d < s.size(); ++d)
      if (s[d] != 1) ai.broadcast_shape[off + d] = s[d];
  }
  // Contiguous indexed dims keep their place; separated ones move the index dims to the front.
  bool contiguous = true;
  for (size_t k = 1; k < ai.index_dims_of.size(); ++k)
    contiguous = contiguous && ai.index_dims_of[k] == ai.index_dims_of[k - 1] + 1;
  ai.first_index_out = contiguous && !ai.index_dims_of.empty() ? ai.index_dims_of.front() : 0;
  ai.out_dim_of_x.assign(x_rank, -1);
  int out = contiguous ? 0 : ai.broadcast_rank;
  bool block_placed = !contiguous;
  for (int d = 0; d < x_rank; ++d) {
    if (ai.indexed[d]) {
      if (!block_placed) {
        out += ai.broadcast_rank;
        block_placed = true;
      }
      continue;
    }
    ai.out_dim_of_x[d] = out++;
  }
  return ai;
}

std::vector<ShardingRow> index_rows(const RuleContext& ctx) {
  const TensorMeta& x = input_meta(ctx, 0);
  AdvancedIndex ai = advanced_index(ctx, x.rank(), 1);
  if (ai.index_inputs.empty() || ai.data_dependent) return {};
  if (output_meta(ctx, 0).rank() != x.rank() - static_cast<int>(ai.index_inputs.size()) + ai.broadcast_rank)
    rule_error(ctx, "unexpected result rank for advanced indexing");
  std::vector<ShardingRow> rows;
  for (int d = 0; d < x.rank(); ++d) {
    if (ai.indexed[d]) continue;
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(ai.out_dim_of_x[d]);
    r.inputs[0] = S(d);
    rows.push_back(r);
  }
  for (int e = 0; e < ai.broadcast_rank; ++e) {
    if (ai.broadcast_shape[e] == 1) continue;
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(ai.first_index_out + e);
    for (int i : ai.index_inputs) {
      const auto& s = input_meta(ctx, i).shape;
      int d = e - (ai.broadcast_rank - static_cast<int>(s.size()));
      r.inputs[i] = d >= 0 && s[d] == ai.broadcast_shape[e] ? S(d) : R();
    }
    rows.push_back(r);
  }
  add_partial_first_input_rows(rows, ctx);
  return dedup_rows(std::move(rows));
}

// index_put(self, indices, values, accumulate=False)
std::vector<ShardingRow> index_put_rows(const RuleContext& ctx) {
  const TensorMeta& self = input_meta(ctx, 0);
  AdvancedIndex ai = advanced_index(ctx, self.rank(), 1);
  const int values_input = static_cast<int>(ctx.inputs.size()) - 1;
  const TensorMeta& values = input_meta(ctx, values_input);
  if (ai.index_inputs.empty() || ai.data_dependent) return {};
  // values broadcast (right-aligned) to the result shape of self[indices].
  const int result_rank = self.rank() - static_cast<int>(ai.index_inputs.size()) + ai.broadcast_rank;
  std::vector<ShardingRow> rows;
  for (int d = 0; d < self.rank(); ++d) {
    if (ai.indexed[d]) continue;
    const int rd = ai.out_dim_of_x[d];
    const int vd = rd - (result_rank - values.rank());
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(d);
    r.inputs[0] = S(d);
    r.inputs[values_input] = vd >= 0 && values.shape[vd] == self.shape[d] && values.shape[vd] != 1 ? S(vd) : R();
    rows.push_back(r);
  }
  ShardingRow p = replicate_row(ctx);
  p.outputs[0] = P(ReduceOp::Sum);
  p.inputs[0] = P(ReduceOp::Sum);
  p.inputs[values_input] = P(ReduceOp::Sum);
  rows.push_back(p);
  return dedup_rows(std::move(rows));
}

}  // namespace

void register_indexing_rules() {
  add_rule("aten.index_select.default", memory_bound_rule(index_select_rows));
  add_rule("aten.gather.default", memory_bound_rule(gather_rows));
  add_rules({"aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default"}, memory_bound_rule(scatter_rows));
  add_rule("aten.index_add.default", memory_bound_rule(index_add_rows));
  add_rule("aten.index.Tensor", memory_bound_rule(index_rows));
  add_rules({"aten.index_put.default", "aten._index_put_impl.default"}, memory_bound_rule(index_put_rows));
}

}  // namespace autoshard
