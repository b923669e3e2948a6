// The plan JSON (docs/formats.md section 3).
#include "autoshard/layout.h"
#include "autoshard/plan.h"

namespace autoshard {

Json plan_to_json(const ShardingModel& sm, const Plan& plan) {
  const Graph& g = *sm.graph;
  const MeshModel& m = *sm.model;
  Json doc = Json::object();
  doc.set("version", Json::integer(1));
  Json mesh = Json::object();
  Json shape = Json::array(), names = Json::array();
  for (int64_t s : m.mesh.shape) shape.push_back(Json::integer(s));
  for (const auto& n : m.mesh.dim_names) names.push_back(Json::string(n));
  mesh.set("shape", std::move(shape));
  mesh.set("dim_names", std::move(names));
  doc.set("mesh", std::move(mesh));
  doc.set("hardware", Json::string(m.hw.name));

  Json nodes = Json::object();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Strategy& s = sm.strategies[i].at(plan.choice[i]);
    Json e = Json::object();
    if (n.op != "placeholder") {
      Json in = Json::array();
      for (const auto& l : s.inputs) in.push_back(layout_to_json(l));
      e.set("inputs", std::move(in));
    }
    Json out = Json::array();
    for (const auto& o : s.outputs) out.push_back(o ? layout_to_json(*o) : Json::null());
    e.set("outputs", std::move(out));
    if (n.op != "placeholder") {
      e.set("compute_us", Json::number(s.compute_us));
      e.set("comm_us", Json::number(plan.cost.node_comm_us[i]));
    } else if (plan.cost.node_comm_us[i] > 0) {
      e.set("comm_us", Json::number(plan.cost.node_comm_us[i]));
    }
    e.set("strategies", Json::integer(static_cast<int64_t>(sm.enumerated[i])));
    nodes.set(n.name, std::move(e));
  }
  doc.set("nodes", std::move(nodes));

  Json outs = Json::array();
  for (const auto& l : plan.cost.output_layouts) outs.push_back(layout_to_json(l));
  doc.set("graph_outputs", std::move(outs));

  Json sum = Json::object();
  sum.set("total_us", Json::number(plan.cost.total_us));
  sum.set("compute_us", Json::number(plan.cost.compute_us));
  sum.set("comm_us", Json::number(plan.cost.comm_us));
  sum.set("exposed_comm_us", Json::number(plan.cost.exposed_comm_us));
  sum.set("parameter_bytes_per_gpu", Json::integer(plan.cost.parameter_bytes_per_gpu));
  sum.set("lower_bound_us", Json::number(plan.lower_bound_us));
  sum.set("solver_status", Json::string(plan.solver_status));
  sum.set("proven_optimal", Json::boolean(plan.proven_optimal));
  sum.set("solver_nodes", Json::integer(static_cast<int64_t>(plan.solver_nodes)));
  sum.set("solver_edges", Json::integer(static_cast<int64_t>(plan.solver_edges)));
  sum.set("solve_time_s", Json::number(plan.solve_time_s));
  sum.set("planning_time_s", Json::number(plan.total_time_s));
  doc.set("summary", std::move(sum));
  return doc;
}

}  // namespace autoshard
