// The planner's entry points: tensor graph JSON + options JSON -> plan JSON with a report.
//
// Options JSON (every field optional except mesh):
//   {"mesh": {"shape": [8, 8], "dim_names": ["dp", "tp"]},
//    "hardware": "H100",
//    "parameter_memory": {"low": 0.0, "high": 0.015625}   (absent: low 0, high 1/mesh size;
//                                                          null: no constraint)
//    "memory_limit_bytes": 80000000000,
//    "input_constraints": {"primals_12": ["S(0)", "R"]},
//    "output_constraints": {"0": ["R", "R"]},
//    "node_constraints": {"mm_3": ["S(0)", "S(1)"]},
//    "time_limit_s": 20,       (the solver's wall-clock budget, default 20)
//    "verbose": false}
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "autoshard/graph.h"
#include "autoshard/lowering.h"
#include "autoshard/plan.h"
#include "autoshard/placement.h"

namespace autoshard {

struct PlannerOptions {
  Mesh mesh;
  std::string hardware = "H100";
  bool parameter_memory_default = true;  // low 0, high 1/mesh.size()
  std::optional<std::pair<double, double>> parameter_memory;  // used when !parameter_memory_default
  int64_t memory_limit_bytes = -1;
  PlacementConstraints constraints;
  double time_limit_s = 20.0;  // the solver's budget; plans stop early when proven optimal
  bool verbose = false;
};

// Parses the options JSON; throws JsonError / std::invalid_argument naming the bad field.
PlannerOptions parse_planner_options(const Json& doc);

// Raised when no plan satisfies the constraints; says which constraint to relax.
class InfeasiblePlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Everything one planning run produced (for tests and tools). `graph` must outlive it.
struct PlanningResult {
  std::unique_ptr<MeshModel> model;
  ShardingModel sharding;
  LoweredProblem lowered;
  Plan plan;
};
PlanningResult run_planner(const Graph& graph, const PlannerOptions& options);

// The whole flow on a parsed graph; returns the plan JSON including "report".
Json plan_graph(const Graph& graph, const PlannerOptions& options);
std::string plan_graph_json(const std::string& graph_json, const std::string& options_json);

}  // namespace autoshard
