// Grouped matrix products (mixture-of-experts): aten._grouped_mm and transformers' custom
// fallback op with its backward (transformers/integrations/moe.py, used when
// torch._grouped_mm cannot run, e.g. float32 weights under torch.compile).
//
// `offs` holds GLOBAL cumulative group ends along the grouped dim, so the grouped dim is never
// sharded and offs is always Replicate. _grouped_mm has four layouts (a = self, b = mat2):
//   2d x 3d  a[M,K] rows grouped, b[G,K,N]   -> [M,N]:   N: [S(1) | R, S(2)];
//            K: [P(sum) | S(1), S(1)]
//   2d x 2d  a[M,K] b[K,N], K grouped        -> [G,M,N]: M: [S(1) | S(0), R]; N: [S(2) | R, S(1)]
//   3d x 2d  a[G,M,K] b[K,N], N grouped      -> [M,N]:   M: [S(0) | S(1), R];
//            K: [P(sum) | S(2), S(0)]
//   3d x 3d  a[G,M,K] b[G,K,N] (bmm, no offs) -> [G,M,N]: G: [S(0) | S(0), S(0)];
//            M: [S(1) | S(1), R]; N: [S(2) | R, S(2)]; K: [P(sum) | S(2), S(1)]
//   and in every layout the linear rows [P(s) | P(s), R], [P(s) | R, P(s)], s in {sum, avg}.
// The kernel wants 16-byte aligned strides, so `accept` keeps a shard of one of the two
// matrix dims only when every rank's block is a multiple of 16 bytes long there.
// transformers.grouped_mm_fallback(input[S,K], weight[E,K,N], offs) is the 2d x 3d layout (no
// alignment needed); its backward (input, weight, offs, grad_out) -> (grad_input[S,K],
// grad_weight[E,K,N]):
//   N: [P(sum), S(2) | R, S(2), R, S(1)]     K: [S(1), S(1) | S(1), S(1), R, R]
//   grad_out P(s): both P(s); input P(s): grad_weight P(s), grad_input R (it does not read
//   input); weight P(s): grad_input P(s), grad_weight R.
#include <algorithm>

#include "autoshard/cost_model.h"
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

// Rows for a (index 0) and b (index 1); every other tensor input (offs) stays R.
std::vector<ShardingRow> grouped_rows(const RuleContext& ctx) {
  const int ra = input_meta(ctx, 0).rank();
  const int rb = input_meta(ctx, 1).rank();
  std::vector<ShardingRow> rows;
  auto row = [&](Placement out, Placement pa, Placement pb) {
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = out;
    r.inputs[0] = pa;
    r.inputs[1] = pb;
    rows.push_back(r);
  };
  const Placement Ps = P(ReduceOp::Sum);
  if (ra == 2 && rb == 3) {
    row(S(1), R(), S(2));
    row(Ps, S(1), S(1));
  } else if (ra == 2 && rb == 2) {
    row(S(1), S(0), R());
    row(S(2), R(), S(1));
  } else if (ra == 3 && rb == 2) {
    row(S(0), S(1), R());
    row(Ps, S(2), S(0));
  } else if (ra == 3 && rb == 3) {
    row(S(0), S(0), S(0));
    row(S(1), S(1), R());
    row(S(2), R(), S(2));
    row(Ps, S(2), S(1));
  } else {
    rule_error(ctx, "operands must be 2-D or 3-D");
  }
  for (ReduceOp op : kLinearReduceOps) {
    row(P(op), P(op), R());
    row(P(op), R(), P(op));
  }
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> aten_grouped_rows(const RuleContext& ctx) {
  if (find_arg(ctx, 3, "bias")) return {};  // not supported by the kernel yet: keep it whole
  return grouped_rows(ctx);
}

// Every rank's block of a sharded matrix dim (the last two dims of a and b) is a multiple of
// 16 bytes, as the kernel requires of the strides.
bool aligned_accept(const RuleContext& ctx, const std::vector<Layout>&, const std::vector<Layout>& ins) {
  for (int k = 0; k < 2; ++k) {
    const TensorMeta& m = input_meta(ctx, k);
    const int64_t align = std::max<int64_t>(1, 16 / std::max<int64_t>(1, dtype_bytes(m.dtype)));
    for (int d = m.rank() - 2; d < m.rank(); ++d) {
      const int64_t shards = shards_on_dim(ctx.mesh, ins.at(k), d);
      if (shards > 1 && m.shape[d] % (shards * align) != 0) return false;
    }
  }
  return true;
}

double grouped_flops(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) {
  if (in.size() < 2 || out.empty()) return 0.0;
  const TensorMeta& a = in[0];
  const TensorMeta& b = in[1];
  if (a.rank() == 2 && b.rank() == 2)  // [M,K] x [K,N]: each K slice goes to one group
    return 2.0 * numel_of(a) * static_cast<double>(b.shape[1]);
  return 2.0 * numel_of(out[0]) * static_cast<double>(a.shape[a.rank() - 1]);
}

std::vector<ShardingRow> fallback_backward_rows(const RuleContext& ctx) {
  if (ctx.inputs.size() != 4 || ctx.outputs.size() != 2)
    rule_error(ctx, "expected (input, weight, offs, grad_output) -> (grad_input, grad_weight)");
  std::vector<ShardingRow> rows;
  auto row = [&](Placement gi, Placement gw, Placement pi, Placement pw, Placement pg) {
    rows.push_back({{gi, gw}, {pi, pw, R(), pg}});
  };
  row(P(ReduceOp::Sum), S(2), R(), S(2), S(1));
  row(S(1), S(1), S(1), S(1), R());
  for (ReduceOp op : kLinearReduceOps) {
    row(P(op), P(op), R(), R(), P(op));
    row(R(), P(op), P(op), R(), R());
    row(P(op), R(), R(), P(op), R());
  }
  return dedup_rows(std::move(rows));
}

}  // namespace

void register_grouped_mm_rules() {
  OpRule aten;
  aten.rows = aten_grouped_rows;
  aten.accept = aligned_accept;
  aten.flops = [](const RuleContext&, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) {
    return grouped_flops(in, out);
  };
  add_rule("aten._grouped_mm.default", aten);

  OpRule fallback;
  fallback.rows = [](const RuleContext& ctx) {
    if (input_meta(ctx, 0).rank() != 2 || input_meta(ctx, 1).rank() != 3)
      rule_error(ctx, "expected input [S, K] and weight [E, K, N]");
    return grouped_rows(ctx);
  };
  fallback.flops = aten.flops;
  add_rule("transformers.grouped_mm_fallback.default", fallback);

  OpRule backward;
  backward.rows = fallback_backward_rows;
  backward.flops = [](const RuleContext&, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) {
    if (in.size() != 4) return 0.0;
    return 4.0 * numel_of(in[3]) * static_cast<double>(in[0].shape.at(1));  // two products of S*K*N
  };
  add_rule("transformers.grouped_mm_fallback_backward.default", backward);
}

}  // namespace autoshard
