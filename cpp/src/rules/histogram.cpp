// Histograms: histc and bincount (e.g. tokens per expert in mixture-of-experts routing).
//
// histc(x, bins=100, min=0, max=0) -> counts[bins] (x's dtype). With a given range
// (min != max) every bin's edges are fixed, so the counts of any split of x add up:
// [P(sum) | S(d)] for every dim d of x. With min == max the kernel takes the range from the
// data, which differs between ranks' blocks: Replicate only. No Partial input rows (counting
// is not linear in the values).
// bincount(x, weights?, minlength=0) -> [max(x)+1 or minlength]: the output length depends on
// the values, so local blocks can give counts of different lengths: Replicate only.
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

std::vector<ShardingRow> histc_rows(const RuleContext& ctx) {
  const double lo = number_arg(ctx, 2, "min", 0.0);
  const double hi = number_arg(ctx, 3, "max", 0.0);
  if (lo == hi) return {};
  std::vector<ShardingRow> rows;
  for (int d = 0; d < input_meta(ctx, 0).rank(); ++d) rows.push_back({{P(ReduceOp::Sum)}, {S(d)}});
  return rows;
}

std::vector<ShardingRow> no_rows(const RuleContext&) { return {}; }

}  // namespace

void register_histogram_rules() {
  add_rule("aten.histc.default", memory_bound_rule(histc_rows));
  add_rule("aten.bincount.default", memory_bound_rule(no_rows));
}

}  // namespace autoshard
