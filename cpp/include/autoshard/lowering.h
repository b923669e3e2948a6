// The sharding model of one graph (strategies per node, constraints) and its lowering to the
// solver problem (problem.h): one solver node per graph node with a choice, edges with
// redistribution cost matrices, gradient and output sinks, parameter-memory budget, memory
// limit over activation live intervals.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "autoshard/build_limits.h"
#include "autoshard/graph.h"
#include "autoshard/overlap_model.h"
#include "autoshard/problem.h"
#include "autoshard/redistribute.h"
#include "autoshard/strategy.h"

namespace autoshard {

// User constraints (pins). Layouts are checked against the tensors they pin.
struct PlacementConstraints {
  std::map<std::string, Layout> inputs;  // placeholder name -> its layout
  std::map<int, Layout> outputs;         // forward output index -> the layout it leaves in
  std::map<std::string, Layout> nodes;   // node name -> layout of its first tensor output
};

// Graph + strategies after pins, and where each graph output must end up.
struct ShardingModel {
  const Graph* graph = nullptr;
  const MeshModel* model = nullptr;
  // Per graph node, pins applied; empty for a node tied to another (repeated_layers.h):
  // read a node's strategies with of().
  std::vector<std::vector<Strategy>> strategies;
  std::vector<size_t> enumerated;  // per graph node, strategies before pins
  std::vector<bool> pinned;        // per graph node
  RepeatedLayers tied;             // which nodes take another's strategy
  // Per entry of graph->outputs: the layout a forward output must leave in (all-R unless
  // constrained); unused for gradients (they leave in their parameter's layout).
  std::vector<Layout> output_targets;

  const std::vector<Strategy>& of(int32_t node) const { return strategies[tied.of(node)]; }
  // How many graph nodes take each node's strategy (0 for a tied copy, 1 for an untied node).
  std::vector<int32_t> tie_counts() const;
};

// Applies the constraints; throws std::invalid_argument naming the constraint when it names
// an unknown node/output, or when no strategy of the node has the requested layout (listing
// the layouts that exist). Tangents of constrained outputs are pinned to the same layout.
// `tied` must be what the strategies were enumerated with, and leave every pinned node untied.
ShardingModel build_sharding_model(const Graph& graph, const MeshModel& model,
                                   std::vector<std::vector<Strategy>> strategies,
                                   const PlacementConstraints& constraints, RepeatedLayers tied = {});

// Gives every tied copy its own strategies (its representative's): the model then plans
// every layer on its own.
void untie_layers(ShardingModel& sm);

// Raised by lower_to_problem when two layouts that no choice can change (nodes with a single
// strategy each, e.g. both pinned) need an impossible redistribution (Shard -> Partial).
class InfeasibleLayoutsError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct LoweringOptions {
  // AutoParallel's add_parameter_memory_constraint(low, high) as fractions of each
  // parameter's bytes; nullopt: no constraint.
  std::optional<std::pair<double, double>> parameter_memory;
  int64_t memory_limit_bytes = -1;      // per GPU over time; negative: none
  bool fold_single_strategy = true;     // nodes with one strategy become constants
  const BuildLimits* limits = nullptr;  // when set, the clock is checked while tables are built
};

// Size of the cost tables lowering will build (one |S_u| x |S_v| table per tensor reference
// and per gradient), counted from the strategy counts before any table exists.
struct TableEstimate {
  double entries = 0;
  double untied_entries = 0;  // as many if every tied copy had tables of its own
  double largest = 0;         // entries of the largest single table
  std::string largest_what;   // "'mm' -> 'relu' (3125 x 3125)"
};
TableEstimate estimate_cost_tables(const ShardingModel& sm);

struct LoweredProblem {
  Problem problem;
  std::vector<int32_t> solver_node;  // graph node -> solver node (-1: folded, strategy 0)
  std::vector<int32_t> graph_node;   // solver node -> graph node
  Cost constant_cost = 0;            // costs that no choice changes (folded nodes / edges)
  int budget_index = -1;             // index of the parameter-memory budget in problem.budgets
  // Parameters that no strategy stores within the budget's `high` fraction (pinned, or too
  // small to split that far): their share is raised to the least they reach, as AutoParallel
  // does; listed so the report says so instead of relaxing the budget silently.
  std::vector<std::string> budget_raised_for;
  // Which redistributions the costs charge at their exposed part, and at what factor.
  OverlapModel overlap;
};

LoweredProblem lower_to_problem(const ShardingModel& sm, const LoweringOptions& options, RedistributionCache& cache);

// Strategy index per graph node from a solver solution.
std::vector<int32_t> expand_solution(const LoweredProblem& lp, const Solution& solution);

// Independent re-evaluation of a choice (one strategy per graph node) straight from the graph:
// compute of every node + every redistribution on every tensor reference + output sinks.
struct ChoiceCost {
  double compute_us = 0;
  double comm_us = 0;                   // every redistribution in full
  double exposed_comm_us = 0;           // the part not hidden behind compute (overlap_model.h)
  double total_us = 0;                  // compute + exposed communication: what the solver minimises
  std::vector<double> node_comm_us;     // per graph node: incoming redistributions + its sinks
  std::vector<Layout> output_layouts;   // per graph output: the layout it leaves in
  int64_t parameter_bytes_per_gpu = 0;  // max local bytes of every parameter
};
// The redistributions of node `c`'s inputs under `choice`: their full time and the part
// charged to the step (not hidden behind compute, overlap_model.h).
struct InputComm {
  double full_us = 0;
  double charged_us = 0;
};
InputComm input_comm(const ShardingModel& sm, const std::vector<int32_t>& choice, size_t c, RedistributionCache& cache,
                     const OverlapModel& overlap);

// `overlap`: the factors the lowered problem was charged with (LoweredProblem::overlap).
ChoiceCost evaluate_choice(const ShardingModel& sm, const std::vector<int32_t>& choice, RedistributionCache& cache,
                           const OverlapModel& overlap);

}  // namespace autoshard
