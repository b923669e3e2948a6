// View and reshape ops: view, _unsafe_view, reshape, t, transpose, permute, unsqueeze,
// squeeze, expand. Every view preserves every Partial kind (it moves no values), and maps
// shard dims through its dim map:
//   - reshape-like ops group adjacent dims whose products match ([B,T,H*D] -> [B,T,H,D] gives
//     groups B->B, T->T, H*D->(H,D)); a sharded input dim survives only as the first (non
//     size-1) dim of its group, landing on the first (non size-1) output dim of the group.
//     For a group that really merges or splits dims, `accept` requires the sharded dim's size
//     on both sides to divide by the number of shards, so that every rank's block is the same
//     contiguous range of the flattened group (DTensor would otherwise need _StridedShard or
//     raise; autoshard keeps plain Shard only).
//   - permute / transpose / t / unsqueeze / squeeze renumber dims;
//   - expand keeps shards on non-broadcast dims; a broadcast (size-1 -> n) dim is never sharded.
#include <algorithm>
#include <numeric>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

struct DimGroup {
  int in_begin, in_end, out_begin, out_end;
};

// Groups of adjacent dims with equal products; size-1 dims that appear or vanish are groups
// of their own with an empty other side. Returns nullopt when the numels disagree or a dim is 0.
std::optional<std::vector<DimGroup>> view_groups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  const int ni = static_cast<int>(in.size()), no = static_cast<int>(out.size());
  if (std::find(in.begin(), in.end(), 0) != in.end() || std::find(out.begin(), out.end(), 0) != out.end())
    return std::nullopt;
  std::vector<DimGroup> groups;
  int i = 0, j = 0;
  while (i < ni || j < no) {
    if (i < ni && in[i] == 1 && (j >= no || out[j] != 1)) {
      groups.push_back({i, i + 1, j, j});
      ++i;
      continue;
    }
    if (j < no && out[j] == 1 && (i >= ni || in[i] != 1)) {
      groups.push_back({i, i, j, j + 1});
      ++j;
      continue;
    }
    if (i >= ni || j >= no) return std::nullopt;
    int64_t pi = in[i], po = out[j];
    int ii = i + 1, jj = j + 1;
    while (pi != po) {
      if (pi < po) {
        if (ii >= ni) return std::nullopt;
        pi *= in[ii++];
      } else {
        if (jj >= no) return std::nullopt;
        po *= out[jj++];
      }
    }
    groups.push_back({i, ii, j, jj});
    i = ii;
    j = jj;
  }
  return groups;
}

int first_non_unit(const std::vector<int64_t>& shape, int begin, int end) {
  for (int d = begin; d < end; ++d)
    if (shape[d] != 1) return d;
  return -1;
}

void add_partial_rows(std::vector<ShardingRow>& rows, const RuleContext& ctx) {
  for (ReduceOp op : kAllReduceOps) rows.push_back(uniform_row(ctx, P(op)));
}

// Rows for a single-input, single-output op from an output-dim -> input-dim map (-1: none).
std::vector<ShardingRow> rows_from_dim_map(const RuleContext& ctx, const std::vector<int>& out_to_in) {
  std::vector<ShardingRow> rows;
  for (int d = 0; d < static_cast<int>(out_to_in.size()); ++d) {
    if (out_to_in[d] < 0) continue;
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = S(d);
    r.inputs[0] = S(out_to_in[d]);
    rows.push_back(r);
  }
  add_partial_rows(rows, ctx);
  return dedup_rows(std::move(rows));
}

// ---- reshape family ----------------------------------------------------------------------
std::vector<ShardingRow> reshape_rows(const RuleContext& ctx) {
  const auto& in = input_meta(ctx, 0).shape;
  const auto& out = output_meta(ctx, 0).shape;
  std::vector<int> out_to_in(out.size(), -1);
  if (auto groups = view_groups(in, out)) {
    for (const DimGroup& g : *groups) {
      int li = first_non_unit(in, g.in_begin, g.in_end);
      int lo = first_non_unit(out, g.out_begin, g.out_end);
      if (li >= 0 && lo >= 0) out_to_in[lo] = li;
    }
  } else {
    rule_error(ctx, "input shape and output shape have different numbers of elements");
  }
  return rows_from_dim_map(ctx, out_to_in);
}

bool reshape_accept(const RuleContext& ctx, const std::vector<Layout>& outputs, const std::vector<Layout>& inputs) {
  const auto& in = input_meta(ctx, 0).shape;
  const auto& out = output_meta(ctx, 0).shape;
  auto groups = view_groups(in, out);
  if (!groups) return false;
  for (const DimGroup& g : *groups) {
    bool one_to_one = (g.in_end - g.in_begin) == 1 && (g.out_end - g.out_begin) == 1;
    if (one_to_one) continue;
    int li = first_non_unit(in, g.in_begin, g.in_end);
    int lo = first_non_unit(out, g.out_begin, g.out_end);
    if (li < 0 || lo < 0) continue;
    int64_t n_in = shards_on_dim(ctx.mesh, inputs.at(0), li);
    int64_t n_out = shards_on_dim(ctx.mesh, outputs.at(0), lo);
    if (n_in != n_out) return false;
    if (!divides(in[li], n_in) || !divides(out[lo], n_out)) return false;
  }
  return true;
}

// ---- renumbering views ---------------------------------------------------------------------
std::vector<ShardingRow> permute_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  std::vector<int64_t> dims = int_list_arg(ctx, 1, "dims");
  if (static_cast<int>(dims.size()) != rank) rule_error(ctx, "permutation length differs from the tensor rank");
  std::vector<int> out_to_in(rank);
  for (int d = 0; d < rank; ++d) out_to_in[d] = wrap_dim(ctx, dims[d], rank);
  return rows_from_dim_map(ctx, out_to_in);
}

std::vector<ShardingRow> transpose_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  std::vector<int> out_to_in(rank);
  std::iota(out_to_in.begin(), out_to_in.end(), 0);
  if (rank >= 1) {
    int d0 = wrap_dim(ctx, int_arg(ctx, 1, "dim0"), rank);
    int d1 = wrap_dim(ctx, int_arg(ctx, 2, "dim1"), rank);
    std::swap(out_to_in[d0], out_to_in[d1]);
  }
  return rows_from_dim_map(ctx, out_to_in);
}

std::vector<ShardingRow> t_rows(const RuleContext& ctx) {
  const int rank = input_meta(ctx, 0).rank();
  std::vector<int> out_to_in(rank);
  std::iota(out_to_in.begin(), out_to_in.end(), 0);
  if (rank == 2) std::swap(out_to_in[0], out_to_in[1]);
  return rows_from_dim_map(ctx, out_to_in);
}

std::vector<ShardingRow> unsqueeze_rows(const RuleContext& ctx) {
  const int out_rank = output_meta(ctx, 0).rank();
  const int dim = wrap_dim(ctx, int_arg(ctx, 1, "dim"), out_rank);
  std::vector<int> out_to_in(out_rank, -1);
  for (int d = 0; d < out_rank; ++d)
    if (d != dim) out_to_in[d] = d < dim ? d : d - 1;
  return rows_from_dim_map(ctx, out_to_in);
}

// squeeze.default / squeeze.dim / squeeze.dims: drops the listed (or all) dims of size 1.
std::vector<ShardingRow> squeeze_rows(const RuleContext& ctx) {
  const auto& in = input_meta(ctx, 0).shape;
  const int rank = static_cast<int>(in.size());
  std::vector<bool> candidate(rank, false);
  const ArgValue* dims = find_arg(ctx, 1, "dim");
  if (!dims) dims = find_arg(ctx, 1, "dims");
  if (!dims) {
    std::fill(candidate.begin(), candidate.end(), true);
  } else {
    for (int64_t d : dims->as_int_list("squeeze dims")) candidate[wrap_dim(ctx, d, rank)] = rank > 0;
  }
  std::vector<int> out_to_in;
  for (int d = 0; d < rank; ++d)
    if (!(candidate[d] && in[d] == 1)) out_to_in.push_back(d);
  if (static_cast<int>(out_to_in.size()) != output_meta(ctx, 0).rank())
    rule_error(ctx, "squeezed rank does not match the traced output rank");
  return rows_from_dim_map(ctx, out_to_in);
}

std::vector<ShardingRow> expand_rows(const RuleContext& ctx) {
  const auto& in = input_meta(ctx, 0).shape;
  const auto& out = output_meta(ctx, 0).shape;
  std::vector<int> out_to_in(out.size(), -1);
  for (int d = 0; d < static_cast<int>(out.size()); ++d) out_to_in[d] = broadcast_source_dim(out, d, in);
  return rows_from_dim_map(ctx, out_to_in);
}

// ---- complex reinterpretation -----------------------------------------------------------
// view_as_complex: [..., 2] real -> [...] complex; view_as_real the reverse. Every dim but the
// trailing (real, imaginary) pair keeps its sharding (complex rotary embeddings shard on
// batch, sequence and heads); the pair itself is never split.
std::vector<ShardingRow> view_as_complex_rows(const RuleContext& ctx) {
  const int out_rank = output_meta(ctx, 0).rank();
  if (input_meta(ctx, 0).rank() != out_rank + 1)
    rule_error(ctx, "input must have one more dim (size 2) than the output");
  std::vector<int> out_to_in(out_rank);
  for (int d = 0; d < out_rank; ++d) out_to_in[d] = d;
  return rows_from_dim_map(ctx, out_to_in);
}

std::vector<ShardingRow> view_as_real_rows(const RuleContext& ctx) {
  const int in_rank = input_meta(ctx, 0).rank();
  if (output_meta(ctx, 0).rank() != in_rank + 1)
    rule_error(ctx, "output must have one more dim (size 2) than the input");
  std::vector<int> out_to_in(in_rank + 1, -1);
  for (int d = 0; d < in_rank; ++d) out_to_in[d] = d;
  return rows_from_dim_map(ctx, out_to_in);
}

}  // namespace

void register_view_rules() {
  OpRule reshape = memory_bound_rule(reshape_rows, true);
  reshape.accept = reshape_accept;
  add_rules({"aten.view.default", "aten._unsafe_view.default", "aten.view_copy.default"}, reshape);
  OpRule reshape_copy = reshape;
  reshape_copy.is_view = false;  // reshape copies when the input is not contiguous
  add_rules({"aten.reshape.default"}, reshape_copy);
  add_rule("aten.permute.default", memory_bound_rule(permute_rows, true));
  add_rule("aten.transpose.int", memory_bound_rule(transpose_rows, true));
  add_rule("aten.t.default", memory_bound_rule(t_rows, true));
  add_rule("aten.unsqueeze.default", memory_bound_rule(unsqueeze_rows, true));
  add_rules({"aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims"}, memory_bound_rule(squeeze_rows, true));
  add_rule("aten.expand.default", memory_bound_rule(expand_rows, true));
  add_rule("aten.view_as_complex.default", memory_bound_rule(view_as_complex_rows, true));
  add_rule("aten.view_as_real.default", memory_bound_rule(view_as_real_rows, true));
}

}  // namespace autoshard
