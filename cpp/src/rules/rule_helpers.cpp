// Shared helpers of the op sharding rules (see autoshard/rule_helpers.h).
#include "autoshard/rule_helpers.h"

#include <algorithm>
#include <stdexcept>

namespace autoshard::rule {

void rule_error(const RuleContext& ctx, const std::string& what) {
  throw std::invalid_argument("sharding rule for node '" + ctx.node.name + "' (" + ctx.node.op + "): " + what);
}

const ArgValue* find_arg(const RuleContext& ctx, size_t pos, const char* name) {
  const ArgValue* v = nullptr;
  if (pos < ctx.node.args.size())
    v = &ctx.node.args[pos];
  else if (name)
    v = ctx.node.kwarg(name);
  if (v && v->kind == ArgValue::Kind::None) return nullptr;
  return v;
}

namespace {
std::string arg_label(const RuleContext& ctx, size_t pos, const char* name) {
  return "node '" + ctx.node.name + "' (" + ctx.node.op + ") argument " + std::to_string(pos) +
         (name ? std::string(" '") + name + "'" : std::string());
}
}  // namespace

int64_t int_arg(const RuleContext& ctx, size_t pos, const char* name, std::optional<int64_t> dflt) {
  const ArgValue* v = find_arg(ctx, pos, name);
  if (!v) {
    if (dflt) return *dflt;
    rule_error(
        ctx, "missing required integer argument " + std::to_string(pos) + (name ? std::string(" '") + name + "'" : ""));
  }
  return v->as_int(arg_label(ctx, pos, name).c_str());
}

double number_arg(const RuleContext& ctx, size_t pos, const char* name, std::optional<double> dflt) {
  const ArgValue* v = find_arg(ctx, pos, name);
  if (!v) {
    if (dflt) return *dflt;
    rule_error(
        ctx, "missing required number argument " + std::to_string(pos) + (name ? std::string(" '") + name + "'" : ""));
  }
  return v->as_number(arg_label(ctx, pos, name).c_str());
}

bool bool_arg(const RuleContext& ctx, size_t pos, const char* name, std::optional<bool> dflt) {
  const ArgValue* v = find_arg(ctx, pos, name);
  if (!v) {
    if (dflt) return *dflt;
    rule_error(ctx,
               "missing required bool argument " + std::to_string(pos) + (name ? std::string(" '") + name + "'" : ""));
  }
  return v->as_bool(arg_label(ctx, pos, name).c_str());
}

std::vector<int64_t> int_list_arg(const RuleContext& ctx, size_t pos, const char* name) {
  const ArgValue* v = find_arg(ctx, pos, name);
  if (!v)
    rule_error(ctx, "missing required integer-list argument " + std::to_string(pos) +
                        (name ? std::string(" '") + name + "'" : ""));
  return v->as_int_list(arg_label(ctx, pos, name).c_str());
}

bool is_tensor_arg(const RuleContext& ctx, size_t pos, const char* name) {
  const ArgValue* v = find_arg(ctx, pos, name);
  return v && v->is_tensor();
}

namespace {
int count_tensors(const ArgValue& v) {
  if (v.kind == ArgValue::Kind::Tensor) return 1;
  int n = 0;
  if (v.kind == ArgValue::Kind::List)
    for (const auto& e : v.list) n += count_tensors(e);
  return n;
}
}  // namespace

int tensor_input_index(const RuleContext& ctx, size_t pos) {
  if (pos >= ctx.node.args.size()) return -1;
  const ArgValue& a = ctx.node.args[pos];
  if (count_tensors(a) == 0) return -1;
  int index = 0;
  for (size_t i = 0; i < pos; ++i) index += count_tensors(ctx.node.args[i]);
  return index;
}

int tensor_kwarg_index(const RuleContext& ctx, const char* name) {
  int index = 0;
  for (const auto& a : ctx.node.args) index += count_tensors(a);
  for (const auto& [key, value] : ctx.node.kwargs) {
    if (key == name) return count_tensors(value) > 0 ? index : -1;
    index += count_tensors(value);
  }
  return -1;
}

std::optional<DType> dtype_kwarg(const RuleContext& ctx, const char* name) {
  const ArgValue* v = ctx.node.kwarg(name);
  if (!v || v->kind == ArgValue::Kind::None) return std::nullopt;
  if (v->kind != ArgValue::Kind::DType) rule_error(ctx, std::string("keyword '") + name + "' is not a dtype");
  return parse_dtype(v->s);
}

int wrap_dim(const RuleContext& ctx, int64_t dim, int rank) {
  int64_t r = std::max(rank, 1);  // a 0-d tensor accepts dim 0 / -1
  int64_t d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r)
    rule_error(ctx, "dim " + std::to_string(dim) + " is out of range for a tensor of rank " + std::to_string(rank));
  return static_cast<int>(d);
}

std::vector<int> reduction_dims(const RuleContext& ctx, const ArgValue* dims_arg, int rank) {
  std::vector<int> dims;
  if (dims_arg && dims_arg->kind != ArgValue::Kind::None) {
    for (int64_t d : dims_arg->as_int_list("reduction dims")) dims.push_back(wrap_dim(ctx, d, rank));
  }
  if (dims.empty())
    for (int d = 0; d < rank; ++d) dims.push_back(d);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

const TensorMeta& input_meta(const RuleContext& ctx, int i) {
  if (i < 0 || i >= static_cast<int>(ctx.inputs.size()))
    rule_error(ctx,
               "expected a tensor input #" + std::to_string(i) + ", the node has " + std::to_string(ctx.inputs.size()));
  return ctx.inputs[i];
}

const TensorMeta& output_meta(const RuleContext& ctx, int i) {
  if (i < 0 || i >= static_cast<int>(ctx.outputs.size()) || !ctx.outputs[i])
    rule_error(ctx, "expected a tensor output #" + std::to_string(i));
  return *ctx.outputs[i];
}

ShardingRow replicate_row(const RuleContext& ctx) {
  ShardingRow r;
  r.outputs.assign(ctx.outputs.size(), R());
  r.inputs.assign(ctx.inputs.size(), R());
  return r;
}

ShardingRow uniform_row(const RuleContext& ctx, Placement p) {
  ShardingRow r;
  r.outputs.assign(ctx.outputs.size(), p);
  r.inputs.assign(ctx.inputs.size(), p);
  return r;
}

void add_partial_first_input_rows(std::vector<ShardingRow>& rows, const RuleContext& ctx) {
  for (ReduceOp op : kLinearReduceOps) {
    ShardingRow r = replicate_row(ctx);
    r.outputs[0] = Placement::partial(op);
    r.inputs[0] = Placement::partial(op);
    rows.push_back(r);
  }
}

std::vector<ShardingRow> dedup_rows(std::vector<ShardingRow> rows) {
  std::vector<ShardingRow> out;
  for (auto& r : rows) {
    bool all_r = std::all_of(r.outputs.begin(), r.outputs.end(), [](const Placement& p) { return p.is_replicate(); }) &&
                 std::all_of(r.inputs.begin(), r.inputs.end(), [](const Placement& p) { return p.is_replicate(); });
    if (all_r) continue;
    bool dup = std::any_of(out.begin(), out.end(),
                           [&](const ShardingRow& o) { return o.outputs == r.outputs && o.inputs == r.inputs; });
    if (!dup) out.push_back(std::move(r));
  }
  return out;
}

int broadcast_source_dim(const std::vector<int64_t>& out_shape, int out_dim, const std::vector<int64_t>& in_shape) {
  int offset = static_cast<int>(out_shape.size()) - static_cast<int>(in_shape.size());
  int d = out_dim - offset;
  if (d < 0 || d >= static_cast<int>(in_shape.size())) return -1;
  if (in_shape[d] != out_shape[out_dim]) return -1;  // size-1 broadcast dim
  return d;
}

std::vector<ShardingRow> pointwise_shard_rows(const RuleContext& ctx) {
  std::vector<ShardingRow> rows;
  if (ctx.outputs.empty() || !ctx.outputs[0]) return rows;
  const auto& out_shape = ctx.outputs[0]->shape;
  for (int d = 0; d < static_cast<int>(out_shape.size()); ++d) {
    ShardingRow r = replicate_row(ctx);
    for (size_t o = 0; o < ctx.outputs.size(); ++o)
      if (ctx.outputs[o] && ctx.outputs[o]->shape == out_shape) r.outputs[o] = S(d);
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      int src = broadcast_source_dim(out_shape, d, ctx.inputs[i].shape);
      r.inputs[i] = src >= 0 ? S(src) : R();
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

bool partial_survives_cast(ReduceOp op, DType from, DType to) {
  if (from == to) return true;
  if (to == DType::Bool) return false;  // x != 0 is neither linear nor order-preserving on sums
  bool linear = op == ReduceOp::Sum || op == ReduceOp::Avg;
  if (dtype_is_floating(from)) {
    if (dtype_is_floating(to)) return true;  // rounding aside, float casts commute with sum/avg/max/min
    if (linear) return false;                // trunc(a + b) != trunc(a) + trunc(b)
    return !dtype_is_complex(to);            // truncation toward zero is non-decreasing
  }
  if (dtype_is_complex(from)) return linear && dtype_is_complex(to);
  // integer or bool source: values are exact in any wider integer or float type; narrowing
  // integer casts wrap modulo 2^k, which still commutes with sum but not with max/min.
  if (from == DType::Bool) return false;  // bool partials carry logical, not numeric, semantics
  if (dtype_is_floating(to)) return true;
  return linear;
}

int64_t shards_on_dim(const Mesh& mesh, const Layout& layout, int dim) {
  int64_t n = 1;
  for (size_t m = 0; m < layout.size() && m < mesh.shape.size(); ++m)
    if (layout[m].is_shard(dim)) n *= mesh.shape[m];
  return n;
}

int64_t min_local_size(int64_t size, const Mesh& mesh, const Layout& layout, int dim) {
  std::vector<int64_t> sizes = {size};
  for (size_t m = 0; m < layout.size() && m < mesh.shape.size(); ++m) {
    if (!layout[m].is_shard(dim)) continue;
    const int64_t n = mesh.shape[m];
    std::vector<int64_t> next;
    for (int64_t s : sizes) {
      const int64_t c = (s + n - 1) / n;
      for (int64_t r = 0; r < n; ++r)
        next.push_back(std::max<int64_t>(0, std::min(s, (r + 1) * c) - std::min(s, r * c)));
    }
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());  // only distinct sizes matter
    sizes = std::move(next);
  }
  return *std::min_element(sizes.begin(), sizes.end());
}

bool has_empty_shard(const Mesh& mesh, const Layout& layout, const TensorMeta& meta) {
  for (int d = 0; d < meta.rank(); ++d)
    if (min_local_size(meta.shape[d], mesh, layout, d) == 0) return true;
  return false;
}

void add_rule(const std::string& op, OpRule rule) { RuleRegistry::instance().add(op, std::move(rule)); }

void add_rules(std::initializer_list<const char*> ops, const OpRule& rule) {
  for (const char* op : ops) add_rule(op, rule);
}

OpRule memory_bound_rule(std::function<std::vector<ShardingRow>(const RuleContext&)> rows, bool is_view) {
  OpRule r;
  r.rows = std::move(rows);
  r.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  r.is_view = is_view;
  return r;
}

double numel_of(const TensorMeta& m) {
  double n = 1;
  for (int64_t s : m.shape) n *= static_cast<double>(s);
  return n;
}

}  // namespace autoshard::rule
