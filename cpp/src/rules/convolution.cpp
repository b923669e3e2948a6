// Convolutions (1-D, 2-D, 3-D; plain and transposed): convolution and convolution_backward.
//
// convolution(x[N, Cin, *sp], w, bias?[Cout], stride, padding, dilation, transposed,
// output_padding, groups) -> out[N, Cout, *sp']. w is [Cout, Cin/g, *k] (transposed:
// [Cin, Cout/g, *k]). A convolution is a matmul over (Cin, kernel window) for every output
// pixel, so:
//   batch:        [S(0) | S(0), R, R]
//   out channels: [S(1) | R, S(w_out), S(0)]              (groups == 1)
//   in channels:  [P(sum) | S(1), S(w_in), P(sum)]         (groups == 1; contraction, the bias
//                 must then be a partial sum too, as addmm's)
//   linear in x and in w: [P(s) | P(s), R, P(s)], [P(s) | R, P(s), P(s)] for s in {sum, avg}
//   spatial dim i, only for non-overlapping windows (kernel == stride, no padding, dilation 1,
//   not transposed): [S(2+i) | S(2+i), R, R]; `accept` keeps it only when every rank's block
//   holds whole windows (the size divides by shards * stride), so local outputs tile the
//   global one (a ViT patch embedding).
// `accept` also drops strategies giving a rank an empty block of any input (the CPU kernels
// mis-shape zero-channel results).
// With groups > 1 a channel shard would also change the group structure the local call sees
// (its `groups` argument stays global), so only batch and Partial rows remain.
//
// convolution_backward(grad_out, x, w, bias_sizes?, stride, padding, dilation, transposed,
// output_padding, groups, output_mask) -> (grad_x?, grad_w?, grad_bias?):
//   batch:        [S(0), P(sum), P(sum) | S(0), S(0), R]
//   out channels: [P(sum), S(w_out), S(0) | S(1), R, S(w_out)]   (grad_x contracts over Cout)
//   in channels:  [S(1), S(w_in), R | R, S(1), S(w_in)]            (grad_bias from a replicated
//                 grad_out is whole on every rank)
//   linear: grad_out P(s) -> all three P(s); x P(s) -> grad_w P(s) (grad_x and grad_bias do
//   not read x: R); w P(s) -> grad_x P(s) (grad_w and grad_bias do not read w: R)
//   spatial (non-overlapping windows, as forward): [S(2+i), P(sum), P(sum) | S(2+i), S(2+i), R]
// FLOPs: 2 * out elements * Cin/groups * kernel volume per product (forward: one; backward:
// one per requested gradient of x and w), on local shapes.
#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

struct ConvArgs {
  int spatial = 0;  // number of spatial dims
  std::vector<int64_t> stride, padding, dilation, kernel;
  bool transposed = false;
  int64_t groups = 1;
  int w_out = 0, w_in = 1;  // weight dims of the output / input channels

  // A spatial dim can be split when every window lies inside one block.
  bool non_overlapping(int i) const {
    return !transposed && kernel[i] == stride[i] && padding[i] == 0 && dilation[i] == 1;
  }
};

// `first` is the schema position of `stride` (3 in forward and backward alike).
ConvArgs conv_args(const RuleContext& ctx, const TensorMeta& x, const TensorMeta& w, size_t first) {
  ConvArgs a;
  if (x.rank() < 3 || w.rank() != x.rank())
    rule_error(ctx, "expected a batched input [N, C, ...] and a weight of the same rank");
  a.spatial = x.rank() - 2;
  auto expand = [&](std::vector<int64_t> v, const char* what) {
    if (v.size() == 1) v.assign(a.spatial, v[0]);
    if (static_cast<int>(v.size()) != a.spatial)
      rule_error(ctx, std::string(what) + " has " + std::to_string(v.size()) + " entries for " +
                          std::to_string(a.spatial) + " spatial dims");
    return v;
  };
  a.stride = expand(int_list_arg(ctx, first, "stride"), "stride");
  a.padding = expand(int_list_arg(ctx, first + 1, "padding"), "padding");
  a.dilation = expand(int_list_arg(ctx, first + 2, "dilation"), "dilation");
  a.transposed = bool_arg(ctx, first + 3, "transposed", false);
  a.groups = int_arg(ctx, first + 5, "groups", 1);
  for (int i = 0; i < a.spatial; ++i) a.kernel.push_back(w.shape[2 + i]);
  if (a.transposed) std::swap(a.w_out, a.w_in);
  return a;
}

std::vector<ShardingRow> conv_forward_rows(const RuleContext& ctx) {
  const TensorMeta& x = input_meta(ctx, 0);
  const TensorMeta& w = input_meta(ctx, 1);
  const ConvArgs a = conv_args(ctx, x, w, 3);
  const bool has_bias = ctx.inputs.size() > 2;
  std::vector<ShardingRow> rows;
  auto row = [&](Placement out, Placement px, Placement pw, Placement pb) {
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = out;
    r.inputs[0] = px;
    r.inputs[1] = pw;
    if (has_bias) r.inputs[2] = pb;
    rows.push_back(r);
  };
  row(S(0), S(0), R(), R());
  if (a.groups == 1) {
    row(S(1), R(), S(a.w_out), S(0));
    row(P(ReduceOp::Sum), S(1), S(a.w_in), P(ReduceOp::Sum));
  }
  for (int i = 0; i < a.spatial; ++i)
    if (a.non_overlapping(i)) row(S(2 + i), S(2 + i), R(), R());
  for (ReduceOp op : kLinearReduceOps) {
    row(P(op), P(op), R(), P(op));
    row(P(op), R(), P(op), P(op));
  }
  return dedup_rows(std::move(rows));
}

std::vector<ShardingRow> conv_backward_rows(const RuleContext& ctx) {
  if (ctx.inputs.size() != 3) rule_error(ctx, "expected grad_output, input and weight tensors");
  const TensorMeta& x = input_meta(ctx, 1);
  const TensorMeta& w = input_meta(ctx, 2);
  const ConvArgs a = conv_args(ctx, x, w, 4);
  if (ctx.outputs.size() != 3) rule_error(ctx, "expected three outputs (grad_input, grad_weight, grad_bias)");
  std::vector<ShardingRow> rows;
  auto row = [&](Placement gx, Placement gw, Placement gb, Placement pg, Placement px, Placement pw) {
    rows.push_back({{gx, gw, gb}, {pg, px, pw}});
  };
  const Placement Ps = P(ReduceOp::Sum);
  row(S(0), Ps, Ps, S(0), S(0), R());
  if (a.groups == 1) {
    row(Ps, S(a.w_out), S(0), S(1), R(), S(a.w_out));
    row(S(1), S(a.w_in), R(), R(), S(1), S(a.w_in));
  }
  for (int i = 0; i < a.spatial; ++i)
    if (a.non_overlapping(i)) row(S(2 + i), Ps, Ps, S(2 + i), S(2 + i), R());
  for (ReduceOp op : kLinearReduceOps) {
    row(P(op), P(op), P(op), P(op), R(), R());
    row(R(), P(op), R(), R(), P(op), R());
    row(P(op), R(), R(), R(), R(), P(op));
  }
  return dedup_rows(std::move(rows));
}

// Spatial shards must hold whole windows on every rank: size % (shards * stride) == 0. And no
// rank may hold an empty block: the CPU kernels return wrongly shaped results for zero
// channels (and oneDNN refuses them).
bool conv_accept(const RuleContext& ctx, const TensorMeta& x, const TensorMeta& w, size_t first, const Layout& x_layout,
                 const std::vector<Layout>& ins) {
  for (size_t i = 0; i < ins.size() && i < ctx.inputs.size(); ++i)
    if (has_empty_shard(ctx.mesh, ins[i], ctx.inputs[i])) return false;
  const ConvArgs a = conv_args(ctx, x, w, first);
  for (int i = 0; i < a.spatial; ++i) {
    const int64_t shards = shards_on_dim(ctx.mesh, x_layout, 2 + i);
    if (shards > 1 && x.shape[2 + i] % (shards * a.stride[i]) != 0) return false;
  }
  return true;
}

// 2 * (elements on the side the products run over) * (weight dim 1 * kernel volume): weight
// dim 1 is Cin/groups (plain: one product per output element) or Cout/groups (transposed: one
// per input element).
double conv_products_flops(const TensorMeta& out_like, const TensorMeta& x, const TensorMeta& w, bool transposed) {
  if (x.rank() < 3 || w.rank() != x.rank()) return 0.0;
  double per = static_cast<double>(w.shape[1]);
  for (int i = 2; i < w.rank(); ++i) per *= static_cast<double>(w.shape[i]);
  return 2.0 * (transposed ? numel_of(x) : numel_of(out_like)) * per;
}

}  // namespace

void register_convolution_rules() {
  OpRule fwd;
  fwd.rows = conv_forward_rows;
  fwd.accept = [](const RuleContext& ctx, const std::vector<Layout>&, const std::vector<Layout>& ins) {
    return conv_accept(ctx, input_meta(ctx, 0), input_meta(ctx, 1), 3, ins.at(0), ins);
  };
  fwd.flops = [](const RuleContext& ctx, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) {
    if (in.size() < 2 || out.empty()) return 0.0;
    const bool transposed = bool_arg(ctx, 6, "transposed", false);
    return conv_products_flops(out[0], in[0], in[1], transposed);
  };
  add_rule("aten.convolution.default", fwd);

  OpRule bwd;
  bwd.rows = conv_backward_rows;
  bwd.accept = [](const RuleContext& ctx, const std::vector<Layout>&, const std::vector<Layout>& ins) {
    return conv_accept(ctx, input_meta(ctx, 1), input_meta(ctx, 2), 4, ins.at(1), ins);
  };
  bwd.flops = [](const RuleContext& ctx, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) {
    if (in.size() < 3) return 0.0;
    const bool transposed = bool_arg(ctx, 7, "transposed", false);
    const double one = conv_products_flops(in[0], in[1], in[2], transposed);
    double total = 0.0;
    for (size_t k = 0; k < 2 && k < out.size(); ++k)
      if (ctx.outputs[k]) total += one;  // grad_input, grad_weight: one product each
    return total;
  };
  add_rule("aten.convolution_backward.default", bwd);
}

}  // namespace autoshard
