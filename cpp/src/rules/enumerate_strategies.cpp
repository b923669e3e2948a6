// Strategy enumeration: expand single-mesh-dim rule rows to the full mesh (Cartesian product
// over mesh dims), filter what DTensor would reject, dedupe, and cost each strategy on its
// LOCAL shapes.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "autoshard/layout.h"
#include "autoshard/rules.h"
#include "autoshard/strategy.h"

namespace autoshard {

namespace {

std::string node_label(const Node& n) {
  std::string s = "node '" + n.name + "'";
  std::string where;
  if (!n.module.empty()) where.append("module ").append(n.module);
  if (!n.source.empty()) where.append(where.empty() ? "" : ", ").append("source: ").append(n.source);
  if (!where.empty()) s.append(" (").append(where).append(")");
  return s;
}

// What a user can do about ops without a rule. The direct fix is a rule of their own through
// torch's register_sharding: the tracer evaluates it into the node's explicit strategies and
// DTensor runs the op with it, so no rebuild of autoshard is needed.
const char* kMissingRuleAdvice =
    "To give an op a sharding rule from Python, register one before tracing with "
    "torch.distributed.tensor.experimental.register_sharding(op) (or autoshard.register_sharding, "
    "the same decorator): autoshard plans the op with it and DTensor runs it (docs/rules.md, "
    "\"User rules\"). Otherwise ask for the op (open an issue naming it and the model), or keep it "
    "out of the traced step: write that line with other ops (docs/rules.md lists the supported "
    "ones), pick another implementation where the model offers one (transformers: "
    "attn_implementation=..., experts_implementation=...), or compute the value outside "
    "forward() and pass it in.";

std::vector<Strategy> placeholder_strategies(const Node& n, const Mesh& mesh) {
  std::vector<Strategy> out;
  for (auto& l : all_unpartial_layouts(n.outputs[0]->shape, mesh)) {
    Strategy s;
    s.outputs.emplace_back(std::move(l));
    out.push_back(std::move(s));
  }
  return out;
}

bool layout_ok(const TensorMeta& m, const Layout& l, const Mesh& mesh) {
  return !has_mixed_partial(l) && is_shardable(m.shape, l, mesh);
}

// Every sharded dim exists and is not empty where it is split (uneven chunks with empty
// trailing ranks allowed: 3 rows over 4 ranks).
bool nonempty_shardable(const std::vector<int64_t>& shape, const Layout& l, const Mesh& mesh) {
  std::vector<int64_t> s = shape;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!l[i].is_shard()) continue;
    int d = l[i].dim;
    if (d < 0 || d >= static_cast<int>(s.size()) || s[d] < 1) return false;
    s[d] = (s[d] + mesh.shape[i] - 1) / mesh.shape[i];
  }
  return true;
}

// A strategy that keeps every tensor where it is: all inputs and outputs have one shape and
// one layout (pointwise ops on equal shapes, casts, copies). Such an op works on each rank's
// block alone, so it is exact for ANY chunking - also an uneven one that DTensor's
// shardability (every rank gets data) rejects. Without this, a tensor already sharded
// unevenly (3 rows over 4 ranks) would have to be gathered just to apply relu or a cast.
bool keeps_uneven_layout(const Strategy& s, const RuleContext& ctx, const Mesh& mesh) {
  const TensorMeta* meta = nullptr;
  const Layout* layout = nullptr;
  auto same = [&](const TensorMeta& m, const Layout& l) {
    if (!meta) {
      meta = &m;
      layout = &l;
    }
    return m.shape == meta->shape && l == *layout;
  };
  for (size_t k = 0; k < s.outputs.size(); ++k)
    if (s.outputs[k] && !same(*ctx.outputs[k], *s.outputs[k])) return false;
  for (size_t a = 0; a < s.inputs.size(); ++a)
    if (!same(ctx.inputs[a], s.inputs[a])) return false;
  return meta && !has_mixed_partial(*layout) && nonempty_shardable(meta->shape, *layout, mesh);
}

// A strategy's identity for deduplication.
std::vector<uint64_t> strategy_key(const Strategy& s) {
  std::vector<uint64_t> k;
  for (const auto& o : s.outputs) k.push_back(o ? layout_code(*o) : ~0ull);
  for (const auto& i : s.inputs) k.push_back(layout_code(i));
  return k;
}

}  // namespace

std::string strategy_str(const Strategy& s) {
  std::string out;
  for (size_t i = 0; i < s.inputs.size(); ++i) out += (i ? "," : "") + layout_str(s.inputs[i]);
  out += " -> ";
  bool first = true;
  for (const auto& o : s.outputs) {
    out += (first ? "" : ",") + (o ? layout_str(*o) : std::string("None"));
    first = false;
  }
  return out;
}

int64_t strategy_bytes(size_t layouts, int mesh_dims) {
  // Strategy itself, a set entry while deduplicating, and per layout its vector plus heap block.
  return 128 + static_cast<int64_t>(layouts) * (48 + 12 * static_cast<int64_t>(mesh_dims));
}

namespace {

// Reserves `combos` strategies of `per` bytes (saturating: 30^8 combinations must not wrap).
int64_t reserve_worst_case(BuildLimits* limits, double combos, int64_t per, const Node& n, int nd) {
  if (!limits) return 0;
  const double bytes = std::min(combos * static_cast<double>(per), 9e18);
  const std::string count = fmt::format("{:.3g}", combos);
  std::string what = "enumerating the strategies of node '";
  what += n.name;
  what += "' (" + n.op + ": up to " + count + " combinations on a " + std::to_string(nd) +
          "-dim mesh) with those of the nodes before it";
  limits->reserve(static_cast<int64_t>(bytes), what);
  return static_cast<int64_t>(bytes);
}

// A rule's rows with the all-Replicate row first (every op can run on full tensors).
std::vector<ShardingRow> rule_rows(const OpRule& rule, const RuleContext& ctx, size_t num_inputs) {
  std::vector<ShardingRow> rows(1);
  rows[0].outputs.assign(ctx.outputs.size(), Placement::replicate());
  rows[0].inputs.assign(num_inputs, Placement::replicate());
  for (auto& row : rule.rows(ctx)) rows.push_back(std::move(row));
  return rows;
}

std::string no_valid_user_strategy(const Node& n, size_t rows, const Mesh& mesh) {
  std::string shape;
  for (int64_t s : mesh.shape) shape += (shape.empty() ? "" : "x") + std::to_string(s);
  return "none of the " + std::to_string(rows) + " strategies that the user sharding rule of op '" + n.op +
         "' gives for " + node_label(n) + " can run on the " + shape +
         " mesh: each shards a tensor dim smaller than the mesh dims splitting it, or mixes Partial kinds. "
         "Include a strategy that fits (all-Replicate always does) in the rule's list.";
}

}  // namespace

std::vector<Strategy> enumerate_node_strategies(const Graph& graph, int32_t index, const MeshModel& model,
                                                BuildLimits* limits) {
  const Node& n = graph.nodes.at(index);
  const Mesh& mesh = model.mesh;
  const int nd = mesh.ndim();
  if (n.op == "placeholder") {
    const int64_t per = strategy_bytes(1, nd);
    const int64_t worst = reserve_worst_case(limits, std::pow(double(n.outputs[0]->shape.size() + 1), nd), per, n, nd);
    std::vector<Strategy> out = placeholder_strategies(n, mesh);
    if (limits) limits->release(worst - static_cast<int64_t>(out.size()) * per);
    return out;
  }

  register_all_rules();
  const OpRule* rule = RuleRegistry::instance().find(n.op);
  // Strategies carried by the node (a user's rule) win over the op's C++ rule.
  const bool user_rows = n.strategies.has_value();
  if (!rule && !user_rows)
    throw UnsupportedOpError(std::string("no sharding rule for op '")
                                 .append(n.op)
                                 .append("' at ")
                                 .append(node_label(n))
                                 .append(". ")
                                 .append(kMissingRuleAdvice));

  std::vector<TensorRef> refs = n.tensor_inputs();
  RuleContext ctx{graph, n, {}, n.outputs, mesh};
  for (const auto& r : refs) ctx.inputs.push_back(graph.meta(r));

  std::vector<ShardingRow> rows = user_rows ? *n.strategies : rule_rows(*rule, ctx, refs.size());
  for (const auto& row : rows)
    if (row.outputs.size() != n.outputs.size() || row.inputs.size() != refs.size())
      throw std::invalid_argument(std::string(user_rows ? "the explicit strategies (user sharding rule)" : "the rule") +
                                  " of op '" + n.op + "' give a row with " + std::to_string(row.outputs.size()) +
                                  " outputs and " + std::to_string(row.inputs.size()) + " inputs, but " +
                                  node_label(n) + " has " + std::to_string(n.outputs.size()) + " outputs and " +
                                  std::to_string(refs.size()) + " tensor inputs");

  const int64_t per = strategy_bytes(n.outputs.size() + refs.size(), nd);
  const int64_t worst = reserve_worst_case(limits, std::pow(double(rows.size()), nd), per, n, nd);
  std::vector<Strategy> out;
  std::set<std::vector<uint64_t>> seen;
  std::vector<size_t> idx(nd, 0);
  for (size_t step = 1;; ++step) {
    if (limits && step % 4096 == 0) limits->check_time(std::string("enumerating the strategies of node ") + n.name);
    Strategy s;
    bool ok = true;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (!n.outputs[k]) {
        s.outputs.emplace_back(std::nullopt);
        continue;
      }
      Layout l(nd);
      for (int i = 0; i < nd; ++i) l[i] = rows[idx[i]].outputs[k];
      ok = ok && layout_ok(*n.outputs[k], l, mesh);
      s.outputs.emplace_back(std::move(l));
    }
    for (size_t a = 0; a < refs.size(); ++a) {
      Layout l(nd);
      for (int i = 0; i < nd; ++i) l[i] = rows[idx[i]].inputs[a];
      ok = ok && layout_ok(ctx.inputs[a], l, mesh);
      s.inputs.push_back(std::move(l));
    }
    // DTensor keeps a user rule's strategies only where every input is shardable (no uneven
    // exception), and it is DTensor that runs them.
    if (!ok && !user_rows) ok = keeps_uneven_layout(s, ctx, mesh);
    if (ok && !user_rows && rule->accept) {
      std::vector<Layout> outs;
      for (const auto& o : s.outputs) outs.push_back(o ? *o : replicate_layout(nd));
      ok = rule->accept(ctx, outs, s.inputs);
    }
    if (ok && seen.insert(strategy_key(s)).second) out.push_back(std::move(s));
    int i = nd - 1;
    while (i >= 0 && ++idx[i] == rows.size()) idx[i--] = 0;
    if (i < 0) break;
  }

  if (limits) limits->release(worst - static_cast<int64_t>(out.size()) * per);
  if (out.empty() && user_rows) throw std::invalid_argument(no_valid_user_strategy(n, rows.size(), mesh));

  // Compute cost on local shapes (views move no data, whoever gives the strategies). A user
  // rule says nothing about FLOPs: an op autoshard has a rule for keeps that rule's FLOP
  // count (it depends on local shapes only); a custom op is costed as memory-bound.
  const bool is_view = rule && rule->is_view;
  for (auto& s : out) {
    s.aliases_input = is_view;
    if (is_view) {
      s.compute_us = 0;
      continue;
    }
    std::vector<TensorMeta> li, lo;
    double bytes = 0;
    for (size_t a = 0; a < refs.size(); ++a) {
      li.push_back(local_meta(ctx.inputs[a], s.inputs[a], mesh));
      bytes += static_cast<double>(li.back().bytes());
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (!n.outputs[k]) {
        lo.push_back(TensorMeta{});
        continue;
      }
      lo.push_back(local_meta(*n.outputs[k], *s.outputs[k], mesh));
      bytes += static_cast<double>(lo.back().bytes());
    }
    double flops = rule && rule->flops ? rule->flops(ctx, li, lo) : 0.0;
    DType dt = !li.empty() ? li[0].dtype : (!lo.empty() && n.outputs[0] ? lo[0].dtype : DType::Float32);
    s.compute_us = (flops == 0 && bytes == 0) ? 0.0 : compute_time_us(model.hw, flops, bytes, dt);
  }
  return out;
}

std::vector<std::vector<Strategy>> enumerate_strategies(const Graph& graph, const MeshModel& model, BuildLimits* limits,
                                                        const RepeatedLayers* tied) {
  std::vector<std::vector<Strategy>> all(graph.nodes.size());
  std::map<std::string, std::string> missing;  // op -> first node, deterministic order
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (tied && tied->of(static_cast<int32_t>(i)) != static_cast<int32_t>(i)) continue;  // its layer's copy
    if (limits)
      limits->check_time("enumerating strategies (node " + std::to_string(i) + " of " +
                         std::to_string(graph.nodes.size()) + ")");
    try {
      all[i] = enumerate_node_strategies(graph, static_cast<int32_t>(i), model, limits);
    } catch (const UnsupportedOpError&) {
      const Node& n = graph.nodes[i];
      missing.emplace(n.op, node_label(n));
      continue;
    }
    if (all[i].empty())
      throw std::runtime_error("node '" + graph.nodes[i].name + "' (" + graph.nodes[i].op +
                               ") has no valid strategy (not even all-Replicate); the rule's accept() "
                               "rejects everything, which is a rule bug");
  }
  if (!missing.empty()) {
    std::ostringstream os;
    os << missing.size() << " op(s) have no sharding rule:";
    for (const auto& [op, where] : missing) os << "\n  " << op << " at " << where;
    os << "\n" << kMissingRuleAdvice;
    throw UnsupportedOpError(os.str());
  }
  return all;
}

}  // namespace autoshard
