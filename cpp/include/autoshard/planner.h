// The planner's entry point: a graph and plain options -> a plan (plan.h) with its sharding
// model and solver problem. Options come from the command line, the Python API's options file
// (io/options_json.h) or C++ callers; all are checked by validate_planner_options.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "autoshard/cost_model.h"
#include "autoshard/graph.h"
#include "autoshard/lowering.h"
#include "autoshard/memory_model.h"
#include "autoshard/plan.h"
#include "autoshard/placement.h"
#include "autoshard/recompute.h"
#include "autoshard/solver.h"

namespace autoshard {

enum class LayerTying { Auto, Tie, Untie };
// "auto" / "tie" / "untie" <-> LayerTying; throws std::invalid_argument naming `what`.
LayerTying parse_layer_tying(const std::string& name, const std::string& what);
const char* layer_tying_name(LayerTying t);

struct PlannerOptions {
  Mesh mesh;
  HardwareProfile hardware = hardware_profile("H100");
  bool parameter_memory_default = true;                       // low 0, high 1/mesh.size()
  std::optional<std::pair<double, double>> parameter_memory;  // used when !parameter_memory_default
  // Peak bytes per GPU: the solver's per-time-point limit (when set) and the limit that
  // recomputation fits the plan to; -1: the solver has none and recomputation fits the
  // plan to default_memory_limit(hardware).
  int64_t memory_limit_bytes = -1;
  PlacementConstraints constraints;
  double time_limit_s = 20.0;  // building + solving; plans stop early when proven optimal
  // The solver stops once (cost - lower bound) <= gap_tolerance * cost; the time limit stays
  // a cap. In [0, 1); 0 asks for a proof of optimality.
  double gap_tolerance = kDefaultGapTolerance;
  // Estimated memory of the strategy tables and solver problem beyond which planning is
  // refused before it is built (a 5-D mesh multiplies the strategies per node). 0: the
  // default cap (default_problem_memory_cap in build_limits.h).
  int64_t max_problem_bytes = 0;
  // Identical repeated layers (repeated_layers.h): Tie prices one layer and gives every
  // identical copy its strategies (the problem grows with one layer, not with the depth; a
  // layer may lose a little against planning each on its own, e.g. the first or last);
  // Untie plans every layer on its own; Auto ties where planning each layer on its own would
  // not fit the memory cap or takes long (see kAutoTieEntries).
  LayerTying repeated_layers = LayerTying::Auto;
  // The optimizer whose state the memory estimate counts (step_memory.h): Adam / AdamW with
  // fp32 moments unless told otherwise; options key "optimizer" (adam, sgd, sgd_momentum, none).
  OptimizerConfig optimizer;
  // What the backward recomputes to fit the memory limit (recompute.h); options key
  // "recompute" (auto, none, selective, full).
  RecomputeMode recompute = RecomputeMode::Auto;
  bool verbose = false;
};

// The share of a GPU's memory a plan leaves free by default: the CUDA context, NCCL's
// buffers and the caching allocator's fragmentation, which the estimate does not count.
inline constexpr double kMemoryReserveFraction = 0.10;
// The peak per GPU recomputation fits plans to when no memory_limit_bytes is set: the
// hardware's memory less kMemoryReserveFraction; 0 (none) when the profile has no memory.
int64_t default_memory_limit(const HardwareProfile& hardware);

// Auto ties layers when the untied problem's cost tables would hold more entries than this
// (about 1.6 GB of tables and the solver's copies; Llama-3-8B on 8x8 has 1.7e7).
inline constexpr double kAutoTieEntries = 2e8;

// Checks the options wherever they come from (options file, command line, C++ callers): throws
// std::invalid_argument naming the option, why, and what to pass instead. run_planner calls it.
void validate_planner_options(const PlannerOptions& options);

// Raised when no plan satisfies the constraints; says which constraint to relax.
// "adam" (also AdamW), "sgd", "sgd_momentum" or "none"; throws std::invalid_argument naming
// `what` and the accepted names otherwise.
OptimizerKind parse_optimizer_kind(const std::string& name, const std::string& what);

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

}  // namespace autoshard
