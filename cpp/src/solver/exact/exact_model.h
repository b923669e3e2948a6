// Internal solver view of a Problem: infeasible costs as +infinity, parallel and reversed
// edges merged into one matrix per node pair, self edges folded into node costs, and time
// compressed to the checkpoints where the live usage can peak (interval starts).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "autoshard/clock.h"
#include "autoshard/problem.h"

namespace autoshard::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

struct PairCosts {
  int32_t a = 0, b = 0;   // a < b
  std::vector<double> m;  // m[sa * |S_b| + sb]
};

struct Adjacent {
  int32_t pair = 0;   // index into pairs
  int32_t other = 0;  // the neighbour node
  bool node_is_a = true;
};

struct BudgetRows {
  std::vector<std::vector<int64_t>> usage;  // [node][strategy], full rows
  int64_t low = 0, high = 0;
};

struct SolverModel {
  int32_t n = 0;
  std::vector<std::vector<double>> cost;    // [node][strategy], +inf when infeasible
  std::vector<std::vector<int64_t>> usage;  // [node][strategy], full rows (zeros when unused)
  std::vector<int32_t> live_lo, live_hi;    // checkpoint range [lo, hi) where the node is live
  std::vector<int64_t> checkpoints;         // sorted time points
  int64_t limit = -1;                       // < 0: no memory limit
  std::vector<PairCosts> pairs;
  std::vector<std::vector<Adjacent>> adj;
  std::vector<BudgetRows> budgets;
  bool integer_costs = false;  // every finite cost is an integer (IOPDDL)

  int32_t strategies(int32_t i) const { return static_cast<int32_t>(cost[i].size()); }
  double pair_cost(const Adjacent& a, int32_t s_node, int32_t s_other) const {
    const PairCosts& pc = pairs[a.pair];
    return a.node_is_a ? pc.m[static_cast<size_t>(s_node) * cost[pc.b].size() + s_other]
                       : pc.m[static_cast<size_t>(s_other) * cost[pc.b].size() + s_node];
  }
  bool has_memory() const { return limit >= 0 && !checkpoints.empty(); }
};

SolverModel build_model(const Problem& problem);

// Objective of a plan in the model (+inf when it takes an infeasible choice).
double model_cost(const SolverModel& m, const std::vector<int32_t>& plan);

using autoshard::Deadline;  // clock.h

}  // namespace autoshard::detail
