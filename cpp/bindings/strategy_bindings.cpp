// `_core.enumerate_strategies(graph_json, options_json, allow_unsupported=False) -> str`:
// every node's strategies on the options' mesh, as the op rules offer them, for the numeric
// rule validator (python/autoshard/validate.py) and for tools that inspect rules.
//
// Result JSON:
//   {"mesh": {"shape": [2, 2]},
//    "nodes": {"mm": [{"inputs": [["S(0)","R"], ["R","R"]], "outputs": [["S(0)","R"]]}, ...]},
//    "unsupported": [{"node": "x", "op": "aten.foo.default", "message": "..."}]}
// Strategies keep enumerate_node_strategies' deterministic order (all-Replicate first); a None
// output is `null`. Without allow_unsupported, an op without a rule raises ValueError with the
// C++ message listing every such op; with it, those nodes are listed under "unsupported".
#include <nanobind/stl/string.h>

#include <map>
#include <stdexcept>

#include "autoshard/layout.h"
#include "autoshard/planner.h"
#include "autoshard/strategy.h"
#include "bindings.h"

namespace nb = nanobind;

namespace autoshard::bindings {

namespace {

Json strategy_to_json(const Strategy& s) {
  Json j = Json::object();
  Json inputs = Json::array();
  for (const auto& l : s.inputs) inputs.push_back(layout_to_json(l));
  Json outputs = Json::array();
  for (const auto& o : s.outputs) outputs.push_back(o ? layout_to_json(*o) : Json::null());
  j.set("inputs", std::move(inputs));
  j.set("outputs", std::move(outputs));
  return j;
}

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
      u.set("node", Json::string(n.name));
      u.set("op", Json::string(n.op));
      u.set("message", Json::string(e.what()));
      unsupported.push_back(std::move(u));
      continue;
    }
    Json list = Json::array();
    for (const auto& s : strategies) list.push_back(strategy_to_json(s));
    nodes.set(n.name, std::move(list));
  }
  Json shape = Json::array();
  for (int64_t d : options.mesh.shape) shape.push_back(Json::integer(d));
  Json mesh = Json::object();
  mesh.set("shape", std::move(shape));
  Json out = Json::object();
  out.set("mesh", std::move(mesh));
  out.set("nodes", std::move(nodes));
  out.set("unsupported", std::move(unsupported));
  return out.dump();
}

}  // namespace

void register_strategies(nb::module_& m) {
  m.def(
      "enumerate_strategies",
      [](const std::string& graph_json, const std::string& options_json, bool allow_unsupported) {
        std::string result, error;
        {
          nb::gil_scoped_release release;
          try {
            result = enumerate_strategies_json(graph_json, options_json, allow_unsupported);
          } catch (const std::exception& e) {
            error = e.what();
          }
        }
        if (!error.empty()) throw nb::value_error(error.c_str());
        return result;
      },
      nb::arg("graph_json"), nb::arg("options_json"), nb::arg("allow_unsupported") = false,
      "Every node's sharding strategies on the options' mesh (options as for plan_graph; only "
      "mesh and hardware are used). Returns JSON {\"mesh\", \"nodes\": {name: [{\"inputs\": "
      "[layout...], \"outputs\": [layout or null...]}]}, \"unsupported\": [...]}. Raises ValueError "
      "on bad input, or on ops without a sharding rule unless allow_unsupported=True.");
}

}  // namespace autoshard::bindings
