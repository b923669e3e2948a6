// The plan JSON (docs/formats.md section 3), and the whole flow from graph and options text
// to plan text that the Python API calls.
#include "io/plan_json.h"

#include <algorithm>

#include "autoshard/clock.h"
#include "autoshard/report.h"
#include "io/graph_json.h"
#include "io/layout_json.h"
#include "io/options_json.h"

namespace autoshard {

namespace {

// docs/formats.md section 3, summary.memory: bytes per GPU.
Json memory_to_json(const StepMemory& m) {
  Json j = Json::object();
  j["peak_bytes"] = m.total_peak();
  j["step_peak_bytes"] = m.step_peak;
  j["peak_at"] = m.peak_at;
  j["parameters"] = m.parameters;
  j["gradients"] = m.gradients;
  j["optimizer_state"] = m.optimizer_state;
  j["saved_activations"] = m.saved_activations;
  j["buffers"] = m.buffers;
  j["inputs"] = m.inputs;
  return j;
}

// docs/formats.md section 3, summary.recompute: the levels chosen per block and their cost.
Json recompute_to_json(const RecomputeDecision& d) {
  Json j = Json::object();
  j["added_us"] = json_number(d.added_us);
  j["limit_bytes"] = d.limit_bytes;
  j["fits"] = d.fits;
  Json blocks = Json::object();
  for (const BlockRecompute& b : d.blocks)
    if (b.level != RecomputeLevel::None) blocks[b.display_name()] = recompute_level_name(b.level);
  j["blocks"] = std::move(blocks);
  return j;
}

}  // namespace

Json plan_to_json(const ShardingModel& sm, const Plan& plan) {
  const Graph& g = *sm.graph;
  const MeshModel& m = *sm.model;
  Json doc = Json::object();
  doc["version"] = 1;
  Json mesh = Json::object();
  Json shape = Json::array(), names = Json::array();
  for (int64_t s : m.mesh.shape) shape.push_back(Json(s));
  for (const auto& n : m.mesh.dim_names) names.push_back(Json(n));
  mesh["shape"] = std::move(shape);
  mesh["dim_names"] = std::move(names);
  doc["mesh"] = std::move(mesh);
  doc["hardware"] = m.hw.name;

  Json nodes = Json::object();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Strategy& s = sm.of(static_cast<int32_t>(i)).at(plan.choice[i]);
    Json e = Json::object();
    if (n.op != "placeholder") {
      Json in = Json::array();
      for (const auto& l : s.inputs) in.push_back(layout_to_json(l));
      e["inputs"] = std::move(in);
    }
    Json out = Json::array();
    for (const auto& o : s.outputs) out.push_back(o ? layout_to_json(*o) : Json(nullptr));
    e["outputs"] = std::move(out);
    if (n.op != "placeholder") {
      e["compute_us"] = json_number(s.compute_us);
      e["comm_us"] = json_number(plan.cost.node_comm_us[i]);
    } else if (plan.cost.node_comm_us[i] > 0) {
      e["comm_us"] = json_number(plan.cost.node_comm_us[i]);
    }
    e["strategies"] = static_cast<int64_t>(sm.enumerated[i]);
    nodes[n.name] = std::move(e);
  }
  doc["nodes"] = std::move(nodes);

  Json outs = Json::array();
  for (const auto& l : plan.cost.output_layouts) outs.push_back(layout_to_json(l));
  doc["graph_outputs"] = std::move(outs);
  Json recomputed = Json::array();
  for (const std::string& name : plan.recompute.node_names(g)) recomputed.push_back(Json(name));
  doc["recompute"] = std::move(recomputed);

  Json sum = Json::object();
  sum["total_us"] = json_number(plan.cost.total_us);
  sum["compute_us"] = json_number(plan.cost.compute_us);
  sum["comm_us"] = json_number(plan.cost.comm_us);
  sum["exposed_comm_us"] = json_number(plan.cost.exposed_comm_us);
  sum["parameter_bytes_per_gpu"] = plan.cost.parameter_bytes_per_gpu;
  sum["lower_bound_us"] = json_number(plan.lower_bound_us);
  sum["solver_status"] = plan.solver_status;
  sum["proven_optimal"] = plan.proven_optimal;
  sum["solver_nodes"] = static_cast<int64_t>(plan.solver_nodes);
  sum["solver_edges"] = static_cast<int64_t>(plan.solver_edges);
  sum["solve_time_s"] = json_number(plan.solve_time_s);
  sum["planning_time_s"] = json_number(plan.total_time_s);
  sum["memory"] = memory_to_json(plan.memory);
  sum["recompute"] = recompute_to_json(plan.recompute);
  doc["summary"] = std::move(sum);
  return doc;
}

Json plan_graph(const Graph& graph, const PlannerOptions& options) {
  PlanningResult r = run_planner(graph, options);
  Json j = plan_to_json(r.sharding, r.plan);
  j["report"] = plan_report(r.sharding, r.plan, options.verbose);
  return j;
}

std::string plan_graph_json(const std::string& graph_json, const std::string& options_json) {
  const auto t0 = Clock::now();
  Json options_doc;
  try {
    options_doc = parse_json(options_json);
  } catch (const JsonError& e) {
    throw JsonError(std::string("options: ") + e.what());
  }
  PlannerOptions options = parse_planner_options(options_doc);
  Json graph_doc;
  try {
    graph_doc = parse_json(graph_json);
  } catch (const JsonError& e) {
    throw JsonError(std::string("graph: ") + e.what());
  }
  Graph graph = parse_graph(graph_doc);
  graph_doc = Json();  // the parsed text's tree is not needed while planning
  // The time limit covers the whole call: reading the graph (about 1 s for Llama-3-405B's
  // 34 k nodes) comes off it, leaving the planner at least a tenth.
  options.time_limit_s = std::max(0.1 * options.time_limit_s, options.time_limit_s - seconds_since(t0));
  return dump_json(plan_graph(graph, options));
}

}  // namespace autoshard
