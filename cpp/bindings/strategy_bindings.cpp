// `_core.enumerate_strategies(graph_json, options_json, allow_unsupported=False) -> str`:
// every node's strategies on the options' mesh, as the op rules offer them, for the numeric
// rule validator (python/autoshard/testing/validate.py) and for tools that inspect rules.
//
// Result JSON:
//   {"mesh": {"shape": [2, 2]},
//    "nodes": {"mm": [{"inputs": [["S(0)","R"], ["R","R"]], "outputs": [["S(0)","R"]],
//                      "compute_us": 12.5}, ...]},
//    "unsupported": [{"node": "x", "op": "aten.foo.default", "message": "..."}]}
// Strategies keep enumerate_node_strategies' deterministic order (all-Replicate first); a None
// output is `null`; each carries its compute estimate ("compute_us").
//
// `_core.redistribution_costs(graph_json, options_json, node, arg) -> str`: what moving the
// node's tensor input `arg` costs: {"producer": name, "rows": [the node's input layout per
// strategy], "cols": [the producer's distinct output layouts], "costs_us": [[row][col]]}
// (AutoParallel's print_costs_for_node). Without allow_unsupported, an op without a rule raises ValueError with the
// C++ message listing every such op; with it, those nodes are listed under "unsupported".
#include <nanobind/stl/string.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "autoshard/planner.h"
#include "autoshard/redistribute.h"
#include "autoshard/strategy.h"
#include "bindings.h"
#include "io/graph_json.h"
#include "io/layout_json.h"
#include "io/options_json.h"
#include "io/strategies_json.h"

namespace nb = nanobind;

namespace autoshard::bindings {

namespace {

Json parse_named(const std::string& text, const char* what) {
  try {
    return parse_json(text);
  } catch (const JsonError& e) {
    throw JsonError(std::string(what) + ": " + e.what());
  }
}

std::string enumerate_strategies_json(const std::string& graph_json, const std::string& options_json,
                                      bool allow_unsupported) {
  PlannerOptions options = parse_planner_options(parse_named(options_json, "options"));
  Graph graph = parse_graph(parse_named(graph_json, "graph"));
  MeshModel model = MeshModel::make(options.mesh, options.hardware);

  Json nodes = Json::object();
  Json unsupported = Json::array();
  if (!allow_unsupported) enumerate_strategies(graph, model);  // throws naming every op without a rule
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    std::vector<Strategy> strategies;
    try {
      strategies = enumerate_node_strategies(graph, static_cast<int32_t>(i), model);
    } catch (const UnsupportedOpError& e) {
      Json u = Json::object();
      u["node"] = n.name;
      u["op"] = n.op;
      u["message"] = e.what();
      unsupported.push_back(std::move(u));
      continue;
    }
    Json list = Json::array();
    for (const auto& s : strategies) list.push_back(strategy_to_json(s));
    nodes[n.name] = std::move(list);
  }
  Json shape = Json::array();
  for (int64_t d : options.mesh.shape) shape.push_back(Json(d));
  Json mesh = Json::object();
  mesh["shape"] = std::move(shape);
  Json out = Json::object();
  out["mesh"] = std::move(mesh);
  out["nodes"] = std::move(nodes);
  out["unsupported"] = std::move(unsupported);
  return dump_json(out);
}

std::string redistribution_costs_json(const std::string& graph_json, const std::string& options_json,
                                      const std::string& node_name, int64_t arg) {
  PlannerOptions options = parse_planner_options(parse_named(options_json, "options"));
  Graph graph = parse_graph(parse_named(graph_json, "graph"));
  MeshModel model = MeshModel::make(options.mesh, options.hardware);
  auto it = graph.index_by_name.find(node_name);
  if (it == graph.index_by_name.end()) throw std::invalid_argument("the graph has no node '" + node_name + "'");
  const int32_t node = it->second;
  const std::vector<TensorRef> refs = graph.nodes[static_cast<size_t>(node)].tensor_inputs();
  if (arg < 0 || arg >= static_cast<int64_t>(refs.size()))
    throw std::invalid_argument("node '" + node_name + "' has " + std::to_string(refs.size()) + " tensor inputs; arg " +
                                std::to_string(arg) + " is out of range");
  const TensorRef& ref = refs[static_cast<size_t>(arg)];
  std::vector<Layout> cols;
  for (const Strategy& s : enumerate_node_strategies(graph, ref.node, model)) {
    const auto& out = s.outputs[static_cast<size_t>(ref.output)];
    if (out && std::find(cols.begin(), cols.end(), *out) == cols.end()) cols.push_back(*out);
  }
  RedistributionCache cache(model);
  Json rows = Json::array(), costs = Json::array(), header = Json::array();
  for (const Layout& c : cols) header.push_back(layout_to_json(c));
  for (const Strategy& s : enumerate_node_strategies(graph, node, model)) {
    const Layout& want = s.inputs[static_cast<size_t>(arg)];
    rows.push_back(layout_to_json(want));
    Json row = Json::array();
    for (const Layout& c : cols) row.push_back(json_number(cache.time_us(graph.meta(ref), c, want)));
    costs.push_back(std::move(row));
  }
  Json out = Json::object();
  out["producer"] = graph.nodes[static_cast<size_t>(ref.node)].name;
  out["rows"] = std::move(rows);
  out["cols"] = std::move(header);
  out["costs_us"] = std::move(costs);
  return dump_json(out);
}

// Runs `fn` without the GIL; C++ exceptions become ValueError.
template <class Fn>
std::string released(Fn fn) {
  std::string result, error;
  {
    nb::gil_scoped_release release;
    try {
      result = fn();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!error.empty()) throw nb::value_error(error.c_str());
  return result;
}

}  // namespace

void register_strategies(nb::module_& m) {
  m.def(
      "enumerate_strategies",
      [](const std::string& graph_json, const std::string& options_json, bool allow_unsupported) {
        return released([&] { return enumerate_strategies_json(graph_json, options_json, allow_unsupported); });
      },
      nb::arg("graph_json"), nb::arg("options_json"), nb::arg("allow_unsupported") = false,
      "Every node's sharding strategies on the options' mesh (options as for plan_graph; only "
      "mesh and hardware are used). Returns JSON {\"mesh\", \"nodes\": {name: [{\"inputs\": "
      "[layout...], \"outputs\": [layout or null...], \"compute_us\": us}]}, \"unsupported\": [...]}. "
      "Raises ValueError "
      "on bad input, or on ops without a sharding rule unless allow_unsupported=True.");
  m.def(
      "redistribution_costs",
      [](const std::string& graph_json, const std::string& options_json, const std::string& node, int64_t arg) {
        return released([&] { return redistribution_costs_json(graph_json, options_json, node, arg); });
      },
      nb::arg("graph_json"), nb::arg("options_json"), nb::arg("node"), nb::arg("arg") = 0,
      "The cost (us) of moving tensor input `arg` of `node` from each output layout its producer "
      "can take (cols) to the layout each of the node's strategies wants (rows): JSON {producer, "
      "rows, cols, costs_us}. Raises ValueError on bad input.");
}

}  // namespace autoshard::bindings
