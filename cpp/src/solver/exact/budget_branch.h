// Branch and bound over the nodes that carry a global budget, for problems without a memory
// limit whose only constraint beyond the pairwise costs is one budget that can bind (the
// planner's parameter-memory budget with headroom, e.g. high = 3/4 on a mesh of 2).
//
// The budget couples every parameter like a knapsack: its Lagrangian relaxation (one
// multiplier mu on sum usage <= high, or on >= low) leaves a pairwise problem that TRW-S
// bounds (often exactly), but the best multiplier can still sit a fraction of a percent below
// the optimum (the duality gap of the knapsack). Each branch-and-bound node restricts some
// budget nodes to a range of budget usage (or a node to a label); its bound is maximised over
// mu (bracketing plus cutting planes through the lines of the decoded plans), and at each mu
// it is TRW-S's bound with the budget nodes held out and then minimised jointly under the
// budget by a knapsack dynamic programme (at least the Lagrangian bound, often well above
// it). It branches on a budget node whose usage differs between the plans on either side of
// the best mu (or, where TRW-S's relaxation is what is loose, on the least decided node).
// Best-first, so the smallest open bound is a proven lower bound throughout and the search
// can stop at a relative gap. The schedule depends only on the problem and the configuration
// (counted work), never on the clock, which only cuts it.
#pragma once

#include <cstdint>
#include <vector>

#include "autoshard/solver.h"
#include "graph_view.h"
#include "heuristic/local_search.h"

namespace autoshard::detail {

struct BudgetBranchConfig {
  Clock::time_point deadline;
  int64_t work_limit = 0;      // > 0: stop after this much counted work
  double gap_tolerance = 0;    // stop once best - bound <= gap_tolerance * |best + cost_offset|
  bool integer_costs = false;  // a proof then needs the gap below a quarter unit
  Cost cost_offset = 0;        // the reduced problem's dropped constant (for relative gaps)
  bool verbose = false;
};

struct BudgetBranchOutcome {
  std::vector<int32_t> best;  // empty when no valid plan was found (or none beat the incumbent)
  Cost best_cost = 0;
  Cost lower_bound = 0;   // proven for the reduced problem
  bool complete = false;  // every node was closed: best (or the incumbent) is optimal
  int64_t nodes = 0;      // branch-and-bound nodes evaluated
  int64_t work = 0;
  const char* stopped_by = "complete";  // "complete", "gap tolerance", "time limit", "work limit"
};

// The budget the branching handles: the only one that can bind, on a problem whose memory
// limit does not apply; -1 when the branching does not apply.
int32_t branching_budget(const GraphView& g, int64_t usage_limit);

// `incumbent` (empty: none) must be valid for g; `incumbent_cost` its cost.
BudgetBranchOutcome budget_branch(const GraphView& g, int32_t budget, const std::vector<int32_t>& incumbent,
                                  Cost incumbent_cost, const BudgetBranchConfig& config);

// The whole step for the dispatcher: reduce, check that the branching applies, map the warm
// start, branch, expand. Returns false (result untouched) when it does not apply; otherwise
// `result` holds its plan (found only when it beat the warm start), bound and status.
bool solve_budget_branch(const Problem& problem, const SolveOptions& options, const Solution* warm_start,
                         SolveResult& result);

}  // namespace autoshard::detail
