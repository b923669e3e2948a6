// Test support for the op-rule tests: builds a one-op graph from a compact description and
// renders rule rows as strings ("S(0)|S(0),R": outputs | inputs) for exact comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "autoshard/graph.h"
#include "autoshard/rule_helpers.h"
#include "autoshard/rules.h"
#include "test_layout_util.h"
#include "io/json.h"
#include "io/graph_json.h"

namespace autoshard::testing_rules {

struct TensorSpec {
  std::vector<int64_t> shape;
  std::string dtype = "float32";
};

inline std::string shape_json(const TensorSpec& t) {
  std::string s = "{\"shape\": [";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + "], \"dtype\": \"" + t.dtype + "\"}";
}

// One op applied to placeholders $0, $1, ... (written as "$0" inside `args_json` and
// `kwargs_json`, e.g. R"([$0, [$1, $2], 1])"). Output entries with an empty dtype are None.
struct OpCase {
  Graph graph;
  Mesh mesh;
  int32_t node = -1;
  const OpRule* rule = nullptr;

  RuleContext ctx() const {
    const Node& n = graph.nodes[node];
    std::vector<TensorMeta> ins;
    for (const TensorRef& r : n.tensor_inputs()) ins.push_back(graph.meta(r));
    return RuleContext{graph, n, ins, n.outputs, mesh};
  }
  std::vector<ShardingRow> rows() const { return rule->rows(ctx()); }
  bool is_view_rule() const { return rule->is_view; }
  bool accept(const std::vector<Layout>& outs, const std::vector<Layout>& ins) const {
    return !rule->accept || rule->accept(ctx(), outs, ins);
  }
  double flops(const std::vector<TensorMeta>& local_in, const std::vector<TensorMeta>& local_out) const {
    return rule->flops ? rule->flops(ctx(), local_in, local_out) : 0.0;
  }
};

inline std::unique_ptr<OpCase> make_case(const std::string& op, const std::vector<TensorSpec>& inputs,
                                         std::string args_json, const std::vector<TensorSpec>& outputs,
                                         std::string kwargs_json = "{}", std::vector<int64_t> mesh = {4}) {
  std::string nodes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    nodes += "{\"name\": \"p" + std::to_string(i) + "\", \"op\": \"placeholder\", \"role\": \"input\", " +
             "\"input_index\": " + std::to_string(i) + ", \"outputs\": [" + shape_json(inputs[i]) + "]},";
  }
  auto subst = [&](std::string s) {
    for (size_t i = inputs.size(); i-- > 0;) {
      std::string key = "$" + std::to_string(i);
      std::string ref = "{\"ref\": \"p" + std::to_string(i) + "\", \"index\": 0}";
      for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + ref.size()))
        s.replace(at, key.size(), ref);
    }
    return s;
  };
  std::string outs;
  for (size_t i = 0; i < outputs.size(); ++i)
    outs += (i ? "," : "") + (outputs[i].dtype.empty() ? std::string("null") : shape_json(outputs[i]));
  nodes += "{\"name\": \"op\", \"op\": \"" + op + "\", \"phase\": \"forward\", \"args\": " + subst(args_json) +
           ", \"kwargs\": " + subst(kwargs_json) + ", \"outputs\": [" + outs + "]}";
  std::string doc = "{\"version\": 1, \"nodes\": [" + nodes + "], \"outputs\": []}";
  auto c = std::make_unique<OpCase>();
  c->graph = parse_graph(parse_json(doc));
  c->node = c->graph.index_by_name.at("op");
  c->mesh.shape = mesh;
  for (size_t i = 0; i < mesh.size(); ++i) c->mesh.dim_names.push_back("m" + std::to_string(i));
  register_all_rules();
  c->rule = RuleRegistry::instance().find(op);
  if (!c->rule) throw std::runtime_error("no rule registered for " + op);
  return c;
}

inline std::string row_str(const ShardingRow& r) {
  std::string s;
  for (size_t i = 0; i < r.outputs.size(); ++i) s += (i ? "," : "") + r.outputs[i].str();
  s += "|";
  for (size_t i = 0; i < r.inputs.size(); ++i) s += (i ? "," : "") + r.inputs[i].str();
  return s;
}

inline std::set<std::string> row_set(const std::vector<ShardingRow>& rows) {
  std::set<std::string> s;
  for (const auto& r : rows) s.insert(row_str(r));
  return s;
}

using ::L;

}  // namespace autoshard::testing_rules
