// Softmax family: _softmax, _log_softmax, _safe_softmax and their backwards normalise along
// `dim`, so any other dim may be sharded (every tensor with the same placement). No Partial:
// softmax is non-linear, and DTensor has no Partial rows for it either. Sharding the softmax
// dim needs a gather (vocab-parallel loss exists only inside DTensor's loss_parallel context).
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

// Every tensor (outputs and inputs) sharded alike on each dim other than the argument `dim`.
std::vector<ShardingRow> all_but_dim_rows(const RuleContext& ctx, size_t dim_pos) {
  const int rank = input_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, dim_pos, "dim"), rank);
  std::vector<ShardingRow> rows;
  for (int d = 0; d < rank; ++d)
    if (d != dim) rows.push_back(uniform_row(ctx, S(d)));
  return dedup_rows(std::move(rows));
}

OpRule softmax_rule(size_t dim_pos) {
  OpRule r;
  r.rows = [dim_pos](const RuleContext& ctx) { return all_but_dim_rows(ctx, dim_pos); };
  r.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  return r;
}

}  // namespace

void register_softmax_rules() {
  // _softmax(x, dim, half_to_float), _safe_softmax(x, dim, dtype)
  add_rules({"aten._softmax.default", "aten._log_softmax.default", "aten._safe_softmax.default"}, softmax_rule(1));
  // _softmax_backward_data(grad_output, output, dim, input_dtype)
  add_rules({"aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default"}, softmax_rule(2));
}

}  // namespace autoshard
