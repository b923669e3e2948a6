// The anytime solver for large problems: exact reductions, then a Lagrangian relaxation of
// the memory limit (one multiplier per time point that matters) whose pairwise subproblem is
// solved by TRW-S message passing. Each round decodes a labeling, repairs it to a valid plan
// and improves it by local search; the dual value gives a proven lower bound. Runs until
// options.time_limit_s and returns the best valid plan found.
#pragma once

#include "autoshard/problem.h"
#include "autoshard/solver.h"

namespace autoshard {

SolveResult solve_heuristic(const Problem& problem, const SolveOptions& options);

}  // namespace autoshard
