// The problem as a mixed-integer program, solved by HiGHS. It closes what the branch and bound
// leaves open on small dense problems (~1,000 nodes with 20-30 strategies each: the exact
// search's bound keeps a gap of a few percent there, where the MILP's LP relaxation with the
// edge marginals is nearly tight and HiGHS proves the optimum in seconds).
//
// Model (the local-marginal polytope):
//   x[i,s] binary per node strategy with a finite cost, sum_s x[i,s] = 1;
//   per edge whose matrix is not a row term plus a column term, y[e,a,b] in [0,1] per finite
//   entry, with sum_b y[e,a,b] = x[u,a] and sum_a y[e,a,b] = x[v,b] (so y is the chosen pair
//   when x is integral, and a missing pair is forbidden); additive matrices go to node costs;
//   memory: one row per time where the live set is maximal, usages above each node's least;
//   global budgets: one row each.
#pragma once

#include <atomic>
#include <cstdint>

#include "autoshard/problem.h"
#include "autoshard/solver.h"
#include "graph_view.h"

namespace autoshard::detail {

// At most how many columns the MILP has (every edge entry a column), or -1 when the problem
// is too large to try (the LP relaxation alone would take minutes). Reads sizes only.
int64_t milp_column_bound(const Problem& p);

// How many columns the MILP has (strategies with a finite cost, plus the finite entries of
// the edges that are not folded into node costs; counting stops once past the model's cap).
// Linear in the edge matrices.
int64_t milp_columns(const GraphView& g);

// Solves the MILP within o.time_limit_s (HiGHS's own clock, one thread, seed o.seed) or until
// `interrupt` is set (another search proved its plan), starting from `incumbent` when given.
// Returns the best plan HiGHS found (found = false if none, or if the model grew past its caps
// while being built) and its proven lower bound; the caller re-evaluates the plan on the
// problem. Never throws for a problem that passed validation.
SolveResult solve_milp(const GraphView& g, int64_t usage_limit, bool integer_costs, const SolveOptions& o,
                       const Solution* incumbent, const std::atomic<bool>* interrupt = nullptr);

}  // namespace autoshard::detail
