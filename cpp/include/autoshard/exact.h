// Exact solving: a depth-first branch and bound that proves optimality (memory limits at every
// time point and global budgets included), and a brute-force enumerator used as ground truth
// by the tests.
#pragma once

#include "autoshard/problem.h"
#include "autoshard/solver.h"

namespace autoshard {

// Branch and bound. Returns the best valid plan found within options.time_limit_s, with
// proven_optimal set when the search completed (or the plan meets the lower bound).
// `warm_start`, when given and valid, seeds the incumbent.
SolveResult solve_exact(const Problem& problem, const SolveOptions& options, const Solution* warm_start = nullptr);

// A fast valid-plan finder (greedy start, memory repair, then single-node improvement moves
// that never break the memory limit or a budget). Used as the exact search's warm start and
// as the dispatcher's fallback for large problems.
SolveResult solve_greedy(const Problem& problem, const SolveOptions& options);

// Enumerates every plan; refuses problems with more than `max_plans` plans
// (std::invalid_argument). Ground truth for tests.
SolveResult solve_brute_force(const Problem& problem, uint64_t max_plans = 5'000'000);

}  // namespace autoshard
