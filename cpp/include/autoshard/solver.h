// The solver's public entry point. `solve` is the dispatcher: exact search for small (or
// reduced-to-small) problems, the anytime heuristic for large ones. Everything is
// deterministic for a given problem, options and thread count.
#pragma once

#include <cstdint>
#include <string>

#include "autoshard/problem.h"

namespace autoshard {

// Time limits above this (about 31 years) are capped, so that converting them to clock ticks
// cannot overflow (1e10 s once wrapped around to a deadline in the past).
inline constexpr double kMaxTimeLimitS = 1e9;

// Checks a time limit where it enters (command line, options JSON, SolveOptions): NaN,
// infinite, zero and negative limits throw std::invalid_argument naming `what` (the anytime
// search only stops at its limit or a proof, so "no limit" could run forever); huge finite
// ones are capped.
double checked_time_limit(double seconds, const std::string& what);

// The planner's default relative gap at which a plan counts as good enough (0.1 %).
inline constexpr double kDefaultGapTolerance = 1e-3;

// Checks a gap tolerance where it enters: a finite fraction in [0, 1); anything else throws
// std::invalid_argument naming `what`.
double checked_gap_tolerance(double fraction, const std::string& what);

struct SolveOptions {
  double time_limit_s = 60.0;  // wall clock, including reductions; the best plan so far is returned
  int threads = 1;             // > 1: a portfolio of independent searches, best plan kept
  // > 0: the large-problem search stops after this much counted work (see `work` below)
  // instead of at the clock, which makes runs bit-identical on any machine; the time limit
  // still applies as a safety net.
  int64_t work_limit = 0;
  // Stop as soon as the best plan is within this fraction of the proven lower bound:
  // (cost - lower_bound) <= gap_tolerance * |cost|. 0: only a proof of optimality (or a limit)
  // stops the search. The time and work limits still cap it.
  double gap_tolerance = 0.0;
  // > 0: the large-problem search also stops after this many rounds in which neither its plan
  // nor its bound improved (the dispatcher sets it when a branch and bound takes over).
  int64_t stall_rounds = 0;
  bool exact = false;  // prove optimality (no time-limit shortcut unless time runs out)
  uint64_t seed = 0;
  bool verbose = false;  // progress lines on stderr
  // Non-empty: HiGHS's own log of every MILP run (presolve, root LP, cuts, branch and bound)
  // is appended to this file. A diagnostic: the plan and the solver's choices do not change.
  std::string milp_log;
};

struct SolveResult {
  bool found = false;  // a valid plan (no infeasible choice, all memory limits held)
  bool proven_optimal = false;
  Solution solution;            // one strategy per node (valid only when found)
  Cost cost = 0;                // objective of `solution`
  Cost lower_bound = 0;         // proven lower bound on the optimum
  int64_t peak_usage = 0;       // max over time of the live usage of `solution`
  double time_to_first_s = -1;  // when the first valid plan was found
  double total_time_s = 0;
  int64_t work = 0;    // counted work of the large-problem search (0 when it did not run)
  std::string status;  // human-readable: "optimal", "gap tolerance", "time limit", "infeasible", ...
  // No plan exists (shown by reductions or a complete search). When !found and this is false,
  // the time (or work) limit ran out before any valid plan was found.
  bool proven_infeasible = false;
};

// Throws std::invalid_argument for a bad time limit (see checked_time_limit).
SolveResult solve(const Problem& problem, const SolveOptions& options);

}  // namespace autoshard
