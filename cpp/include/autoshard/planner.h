// The planner's entry points: tensor graph JSON + options JSON -> plan JSON with a report.
//
// Options JSON (every field optional except mesh):
//   {"mesh": {"shape": [8, 8], "dim_names": ["dp", "tp"]},
//    "hardware": "H100",       (or an object of profile fields: {"base": "CPU", ...})
//    "parameter_memory": {"low": 0.0, "high": 0.015625}   (absent: low 0, high 1/mesh size;
//                                                          null: no constraint)
//    "memory_limit_bytes": 80000000000,
//    "input_constraints": {"primals_12": ["S(0)", "R"]},
//    "output_constraints": {"0": ["R", "R"]},
//    "node_constraints": {"mm_3": ["S(0)", "S(1)"]},
//    "time_limit_s": 20,       (wall-clock budget of building the problem and solving it,
//                               default 20; > 0, huge values mean no limit)
//    "gap_tolerance": 0.001,   (stop once the plan is within this fraction of its lower
//                               bound, default 0.1 %; 0: only a proof or the time limit)
//    "max_problem_bytes": 8000000000,  (refuse meshes/graphs whose solver problem is
//                               estimated to need more memory than this; absent or null:
//                               8 GB, or 80% of the available memory / ulimit -v if less)
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
#include "autoshard/solver.h"

namespace autoshard {

struct PlannerOptions {
  Mesh mesh;
  std::string hardware = "H100";  // a profile name, or a JSON object of profile fields as text
  bool parameter_memory_default = true;  // low 0, high 1/mesh.size()
  std::optional<std::pair<double, double>> parameter_memory;  // used when !parameter_memory_default
  int64_t memory_limit_bytes = -1;  // per GPU; -1: no limit (users omit it, never pass <= 0)
  PlacementConstraints constraints;
  double time_limit_s = 20.0;  // building + solving; plans stop early when proven optimal
  // The solver stops once (cost - lower bound) <= gap_tolerance * cost; the time limit stays
  // a cap. In [0, 1); 0 asks for a proof of optimality.
  double gap_tolerance = kDefaultGapTolerance;
  // Estimated memory of the strategy tables and solver problem beyond which planning is
  // refused before it is built (a 5-D mesh multiplies the strategies per node). 0: the
  // default cap (default_problem_memory_cap in build_limits.h).
  int64_t max_problem_bytes = 0;
  bool verbose = false;
};

// Parses the options JSON; throws JsonError / std::invalid_argument naming the bad field.
PlannerOptions parse_planner_options(const Json& doc);

// Checks the options wherever they come from (JSON, command line, C++ callers): throws
// std::invalid_argument naming the option, why, and what to pass instead. run_planner calls it.
void validate_planner_options(const PlannerOptions& options);

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
