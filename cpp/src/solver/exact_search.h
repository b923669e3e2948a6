// Internal: the branch and bound behind solve_exact (see exact_search.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "exact_model.h"

namespace autoshard::detail {

struct ExactOutcome {
  std::vector<int32_t> plan;   // best plan (valid when cost is finite)
  double cost = kInf;
  double lower_bound = 0;      // proven; equals cost when complete
  bool complete = false;       // search exhausted: cost is optimal (or +inf: nothing fits)
  uint64_t nodes = 0;
};

ExactOutcome branch_and_bound(const SolverModel& m, const Deadline& deadline, std::vector<int32_t> incumbent,
                              double incumbent_cost);

// Greedy valid plans used as warm starts (exact_warm_start.cpp).
std::vector<std::vector<int32_t>> greedy_plans(const SolverModel& m, const Deadline& deadline);

}  // namespace autoshard::detail
