// The anytime solver for large problems:
//  1. exact reductions (autoshard/reduce.h);
//  2. a Lagrangian relaxation of the memory limit, one multiplier per time point that matters
//     (interval starts), whose pairwise subproblem is solved by TRW-S message passing: first
//     subgradient steps (fast bound), then gentle multiplicative "adaptive penalty" updates;
//     the dual value is a proven lower bound for any multipliers >= 0;
//  3. nodes tied by bijective edges (XLA follow/alias constraints) are decoded, repaired and
//     moved as groups;
//  4. now and then (a fixed share of the counted work) the decoded plan is repaired to the
//     limit, improved by single and group descent, then by large-neighbourhood search: exact
//     DP on induced trees of groups, priced with the current multipliers, kept only when the
//     true plan is valid and cheaper.
// With options.threads > 1, that many independent runs (different seeds and schedules) share
// the reduced graph; the best plan and the best bound are kept. Runs until
// options.time_limit_s, options.work_limit or a proof of optimality.
#pragma once

#include "autoshard/problem.h"
#include "autoshard/solver.h"

namespace autoshard {

SolveResult solve_heuristic(const Problem& problem, const SolveOptions& options);

}  // namespace autoshard
