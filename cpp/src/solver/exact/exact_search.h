// Internal: the branch and bound behind solve_exact (see exact_search.cpp) and the greedy
// plans that warm-start it, both on the problem's GraphView.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "autoshard/clock.h"
#include "autoshard/solver.h"
#include "graph_view.h"

namespace autoshard::detail {

using autoshard::Deadline;  // clock.h

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The search's sums take infeasible entries as +infinity, so that a sum with one stays
// infeasible whatever is added (the view stores them as kInfeasibleCost).
inline double cost_or_inf(Cost c) { return is_infeasible(c) ? kInf : c; }

// The memory checkpoints the exact side checks (live_points): none without a memory limit.
LivePoints limit_points(const GraphView& g);

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
// bound is then the smallest such bound, not the optimum. `integer_costs`: every finite cost
// is an integer (IOPDDL), so a better plan costs at least one unit less.
ExactOutcome branch_and_bound(const GraphView& g, bool integer_costs, const Deadline& deadline,
                              std::vector<int32_t> incumbent, double incumbent_cost, double gap_tolerance = 0,
                              double cost_offset = 0);

// A bound that needs no search (exact_search.cpp); +inf when some node has no finite choice.
double simple_lower_bound(const GraphView& g);

// Greedy valid plans used as warm starts (exact_warm_start.cpp). `p` is the problem `g` views:
// one start orders strategies by their usage as given, also where the view zeroes it.
std::vector<std::vector<int32_t>> greedy_plans(const GraphView& g, const Problem& p, const Deadline& deadline);

// solve_greedy on a view already built (solve() shares it); `deadline` counts from before the
// view was built.
SolveResult solve_greedy(const Problem& problem, const GraphView& g, const Deadline& deadline);

}  // namespace autoshard::detail
