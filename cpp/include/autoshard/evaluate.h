// Independent evaluation of a plan: the ground truth every solver result is checked against
// before it is reported. Deliberately simple (no incremental state) so that it can be trusted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoshard/problem.h"

namespace autoshard {

struct Evaluation {
  bool well_formed = false;          // one in-range strategy per node
  bool takes_infeasible = false;     // some chosen node cost or edge entry is >= kInfeasibleCost
  Cost cost = 0;                     // sum of chosen node costs and edge entries (huge when infeasible)
  int64_t peak_usage = 0;            // max over integer time points of the live usage
  int64_t peak_time = 0;             // a time point where the peak is reached
  bool memory_ok = true;             // peak_usage <= usage_limit (or no limit)
  std::vector<int64_t> budget_sums;  // one per GlobalBudget
  bool budgets_ok = true;
  bool valid = false;     // well formed, nothing infeasible, memory and budgets held
  std::string violation;  // the first reason the plan is not valid ("" when valid)
};

Evaluation evaluate(const Problem& problem, const Solution& solution);

// Live usage at every time point where it changes: the peak over [start, end) for a plan.
// Sums saturate at INT64_MAX instead of overflowing.
int64_t peak_usage(const Problem& problem, const Solution& solution, int64_t* peak_time = nullptr);

}  // namespace autoshard
