// A plan: the chosen strategy of every graph node and its costs. io/plan_json.h writes it as
// the plan file of docs/formats.md section 3 that the Python runtime executes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoshard/lowering.h"
#include "autoshard/recompute.h"
#include "autoshard/step_memory.h"

namespace autoshard {

struct Plan {
  std::vector<int32_t> choice;     // strategy index per graph node (into ShardingModel::strategies)
  ChoiceCost cost;                 // independent evaluation of `choice`
  StepMemory memory;               // what each GPU holds over the step under `choice` and `recompute`
  RecomputeDecision recompute;     // what the backward recomputes, per block (recompute.h)
  double lower_bound_us = 0;       // the solver's proven bound (+ constant costs)
  double solver_objective_us = 0;  // the solver's objective (+ constant costs), equals cost.total_us
  bool proven_optimal = false;
  std::string solver_status;
  double solve_time_s = 0;
  double total_time_s = 0;      // enumeration + lowering + solve
  double enumerate_time_s = 0;  // strategies and pins
  double lower_time_s = 0;      // solver problem construction
  size_t solver_nodes = 0;      // problem size after folding
  size_t solver_edges = 0;
  std::vector<std::string> notes;  // what the report must point out (e.g. a budget raised for some parameters)
};

}  // namespace autoshard
