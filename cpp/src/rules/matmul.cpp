// Matrix products: mm, addmm, bmm, baddbmm, dot.
//
// For out = a @ b with free dims M (a only), N (b only), contraction K and batch B:
//   shard M:  [S(M_out) | S(M_a), R]         shard N: [S(N_out) | R, S(N_b)]
//   shard B:  [S(B_out) | S(B_a), S(B_b)]    shard K: [P(sum) | S(K_a), S(K_b)]
//   linear in each operand: [P(s) | P(s), R], [P(s) | R, P(s)] for s in {sum, avg}.
// addmm / baddbmm add `beta*bias`: the bias follows the output where it has that dim (R where
// broadcast) and must itself be Partial of the same kind when the output is Partial (a
// replicated bias would be added once per rank).
// FLOPs: 2*M*K*N (times B) on local shapes; the bias add is memory-bound and ignored.
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

// Rows for out[batch..., M, N] = a[batch..., M, K] @ b[batch..., K, N] where a and b are the
// tensor inputs at indices ia and ib; `bias` (index ibias, or -1) is broadcast to the output.
std::vector<ShardingRow> matmul_rows(const RuleContext& ctx, int ia, int ib, int ibias) {
  const TensorMeta& out = output_meta(ctx, 0);
  const int rank = out.rank();
  const int batch = rank - 2;
  std::vector<ShardingRow> rows;
  auto bias_for = [&](ShardingRow& r, int out_dim) {
    if (ibias < 0) return;
    int src = broadcast_source_dim(out.shape, out_dim, input_meta(ctx, ibias).shape);
    r.inputs[ibias] = src >= 0 ? S(src) : R();
  };
  for (int d = 0; d < batch; ++d) {
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(d);
    r.inputs[ia] = S(d);
    r.inputs[ib] = S(d);
    bias_for(r, d);
    rows.push_back(r);
  }
  {  // M
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(batch);
    r.inputs[ia] = S(batch);
    bias_for(r, batch);
    rows.push_back(r);
  }
  {  // N
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(batch + 1);
    r.inputs[ib] = S(batch + 1);
    bias_for(r, batch + 1);
    rows.push_back(r);
  }
  {  // K: contraction gives partial sums
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = P(ReduceOp::Sum);
    r.inputs[ia] = S(batch + 1);
    r.inputs[ib] = S(batch);
    if (ibias >= 0) r.inputs[ibias] = P(ReduceOp::Sum);
    rows.push_back(r);
  }
  for (ReduceOp op : kLinearReduceOps) {
    for (int which : {ia, ib}) {
      ShardingRow r = replicate_row(ctx);
      r.outputs[0] = P(op);
      r.inputs[which] = P(op);
      if (ibias >= 0) r.inputs[ibias] = P(op);
      rows.push_back(r);
    }
  }
  return dedup_rows(std::move(rows));
}

double matmul_flops(const std::vector<TensorMeta>& in, int ia, int ib) {
  const TensorMeta& a = in.at(ia);
  const TensorMeta& b = in.at(ib);
  if (a.rank() < 2 || b.rank() < 2) return 0;
  double m = static_cast<double>(a.shape[a.rank() - 2]);
  double k = static_cast<double>(a.shape[a.rank() - 1]);
  double n = static_cast<double>(b.shape[b.rank() - 1]);
  double batch = 1;
  for (int d = 0; d < a.rank() - 2; ++d) batch *= static_cast<double>(a.shape[d]);
  return 2.0 * batch * m * k * n;
}

OpRule matmul_rule(int ia, int ib, int ibias, int expected_inputs) {
  OpRule r;
  r.rows = [=](const RuleContext& ctx) {
    if (static_cast<int>(ctx.inputs.size()) != expected_inputs)
      rule_error(ctx, "expected " + std::to_string(expected_inputs) + " tensor inputs, found " +
                          std::to_string(ctx.inputs.size()));
    const int want_rank = input_meta(ctx, ia).rank();
    if (want_rank < 2 || input_meta(ctx, ib).rank() != want_rank || output_meta(ctx, 0).rank() != want_rank)
      rule_error(ctx, "operands must be matrices (or batches of them) of the same rank");
    return matmul_rows(ctx, ia, ib, ibias);
  };
  r.flops = [=](const RuleContext&, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) {
    return matmul_flops(in, ia, ib);
  };
  return r;
}

// dot(a[K], b[K]) -> scalar: [P | S0, S0] and the per-operand linear rows.
std::vector<ShardingRow> dot_rows(const RuleContext& ctx) {
  std::vector<ShardingRow> rows;
  ShardingRow r = replicate_row(ctx);
  r.outputs[0] = P(ReduceOp::Sum);
  r.inputs = {S(0), S(0)};
  rows.push_back(r);
  for (ReduceOp op : kLinearReduceOps) {
    rows.push_back({{P(op)}, {P(op), R()}});
    rows.push_back({{P(op)}, {R(), P(op)}});
  }
  return rows;
}

}  // namespace

void register_matmul_rules() {
  add_rule("aten.mm.default", matmul_rule(0, 1, -1, 2));
  add_rule("aten.bmm.default", matmul_rule(0, 1, -1, 2));
  add_rule("aten.addmm.default", matmul_rule(1, 2, 0, 3));
  add_rule("aten.baddbmm.default", matmul_rule(1, 2, 0, 3));
  OpRule dot;
  dot.rows = dot_rows;
  dot.flops = [](const RuleContext&, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) {
    return in.empty() ? 0.0 : 2.0 * numel_of(in[0]);
  };
  add_rule("aten.dot.default", dot);
}

}  // namespace autoshard
