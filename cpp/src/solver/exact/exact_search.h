// Internal: the branch and bound behind solve_exact (see exact_search.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "exact/exact_model.h"

namespace autoshard::detail {

struct ExactOutcome {
  std::vector<int32_t> plan;  // best plan (valid when cost is finite)
  double cost = kInf;
  double lower_bound = 0;         // proven; equals cost when complete
  bool complete = false;          // search exhausted: cost is optimal (or +inf: nothing fits),
                                  // or within the gap tolerance when tolerance_bound is finite
  double tolerance_bound = kInf;  // smallest bound of a branch cut only by the gap tolerance
  uint64_t nodes = 0;
};

// `gap_tolerance` > 0 also cuts branches whose bound is within gap_tolerance * |best +
// cost_offset| of the best plan (cost_offset: what the reductions dropped); the outcome's
// bound is then the smallest such bound, not the optimum.
ExactOutcome branch_and_bound(const SolverModel& m, const Deadline& deadline, std::vector<int32_t> incumbent,
                              double incumbent_cost, double gap_tolerance = 0, double cost_offset = 0);

// Greedy valid plans used as warm starts (exact_warm_start.cpp).
std::vector<std::vector<int32_t>> greedy_plans(const SolverModel& m, const Deadline& deadline);

}  // namespace autoshard::detail
