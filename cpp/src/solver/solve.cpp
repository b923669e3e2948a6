// The dispatcher behind autoshard::solve(): exact branch and bound for small problems or when
// asked, the anytime heuristic otherwise; whatever ran, the best valid plan and the best
// lower bound are kept, and the returned plan is re-evaluated from scratch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"
#include "autoshard/problem.h"
#include "autoshard/solver.h"
#include "exact/budget_branch.h"
#include "exact/exact_search.h"

#if __has_include("autoshard/heuristic.h")
#include "autoshard/heuristic.h"
#define AUTOSHARD_HAVE_HEURISTIC 1
#else
#define AUTOSHARD_HAVE_HEURISTIC 0
#endif

namespace autoshard {

namespace {

// Problems this small are always solved exactly: the search finishes in well under a second.
bool small_enough_for_exact(const Problem& p) {
  if (p.num_nodes() <= 12) return true;
  double plans = 1;
  for (size_t i = 0; i < p.num_nodes(); ++i) {
    plans *= static_cast<double>(p.num_strategies(i));
    if (plans > 1e6) return false;
  }
  return true;
}

// A budget that can bind and no memory limit that applies: the budget branch and bound
// (budget_branch.h) may close what the heuristic's Lagrangian bound leaves open.
bool may_branch_on_budget(const Problem& p) {
  if (p.budgets.empty()) return false;
  if (p.usage_limit < 0) return true;
  for (const auto& row : p.node_usages)
    for (int64_t u : row)
      if (u > 0) return false;
  return true;
}

// Within the gap tolerance: cost - bound <= tolerance * |cost|.
bool within_gap(const SolveResult& r, double tolerance) {
  return r.found && tolerance > 0 && r.cost - r.lower_bound <= tolerance * std::abs(r.cost);
}

SolveResult run_heuristic(const Problem& p, const SolveOptions& o) {
#if AUTOSHARD_HAVE_HEURISTIC
  return solve_heuristic(p, o);
#else
  return solve_greedy(p, o);
#endif
}

// Keeps the better of two results: valid plans beat invalid ones, then lower cost; the lower
// bound is the larger of the two (both are proven).
void merge_into(SolveResult& best, const SolveResult& other, const Problem& p, double elapsed_before) {
  if (other.found) {
    Evaluation ev = evaluate(p, other.solution);
    if (ev.valid && (!best.found || ev.cost < best.cost)) {
      if (!best.found && other.time_to_first_s >= 0) best.time_to_first_s = elapsed_before + other.time_to_first_s;
      best.found = true;
      best.solution = other.solution;
      best.cost = ev.cost;
      best.peak_usage = ev.peak_usage;
    }
  }
  best.lower_bound = std::max(best.lower_bound, other.lower_bound);
  best.work += other.work;
  if (other.proven_optimal) best.proven_optimal = true;
  if (!other.status.empty()) best.status = other.status;
}

}  // namespace

double checked_time_limit(double seconds, const std::string& what) {
  if (!std::isfinite(seconds) || seconds <= 0) {
    throw std::invalid_argument(what + " must be a finite number of seconds > 0, got " + fmt::format("{:g}", seconds) +
                                " (the search runs until this limit unless it proves its plan optimal, so it "
                                "needs one; e.g. 60)");
  }
  return std::min(seconds, kMaxTimeLimitS);
}

double checked_gap_tolerance(double fraction, const std::string& what) {
  if (!(fraction >= 0.0 && fraction < 1.0)) {  // NaN fails too
    const std::string got = fmt::format("{:g}", fraction);
    throw std::invalid_argument(what +
                                " must be a fraction in [0, 1) (the relative gap between the plan and its "
                                "lower bound at which the search stops; e.g. 0.001 for 0.1 %, 0 to ask for a proof "
                                "of optimality), got " +
                                got);
  }
  return fraction;
}

SolveResult solve(const Problem& problem, const SolveOptions& given) {
  SolveOptions options = given;
  options.time_limit_s = checked_time_limit(given.time_limit_s, "the solver time limit (time_limit_s)");
  options.gap_tolerance = checked_gap_tolerance(given.gap_tolerance, "the gap tolerance (gap_tolerance)");
  validate_problem(problem);
  detail::Deadline deadline;
  deadline.limit_s = options.time_limit_s;
  SolveResult best;
  best.lower_bound = -kInfeasibleCost;

  const bool exact_only = small_enough_for_exact(problem);
  const bool budget_branching = !exact_only && !options.exact && may_branch_on_budget(problem);
  // The bound that needs no search, kept for when nothing better is proven (below).
  Cost simple_bound = -kInfeasibleCost;
  if (!exact_only) {
    // Safety net: the memory-reserving greedy finds a valid plan in a fraction of the time on
    // every IOPDDL instance measured where one exists, so a heuristic that finds nothing in
    // its time still leaves a plan to return. The greedy and the simple bound share one view
    // of the unreduced problem; it references the problem's matrices where it can rather than
    // copying them.
    SolveResult greedy;
    const auto safety_net = [&] {
      detail::Deadline greedy_deadline;
      greedy_deadline.limit_s = options.time_limit_s * 0.1;
      const detail::GraphView view = detail::build_referencing_view(problem);
      greedy = detail::solve_greedy(problem, view, greedy_deadline);
      if (!options.exact) simple_bound = detail::simple_lower_bound(view);
    };
    // With two threads or more the greedy runs beside the heuristic's reduction, which is
    // single-threaded and takes about as long (public instances: greedy 0.25-0.45 s,
    // reduction 0.3-0.6 s; llama2L-2x4x4 0.7 s and 1.3 s), so the searches start that much
    // sooner. With one thread it runs first, and its view is released before the heuristic
    // builds its own. The future's get() rethrows the greedy's exception, and its destructor
    // waits for the thread if the heuristic throws first.
    const bool beside = options.threads >= 2;
    std::future<void> net;
    if (beside)
      net = std::async(std::launch::async, safety_net);
    else
      safety_net();
    SolveOptions ho = options;
    // The heuristic always gets most of the time, even if the greedy ran over its share.
    ho.time_limit_s = std::max(0.8 * options.time_limit_s, options.time_limit_s - deadline.elapsed());
    // With --exact the heuristic only provides the warm start; the search gets most of the time.
    if (options.exact) ho.time_limit_s = std::min(ho.time_limit_s, options.time_limit_s * 0.25);
    // With a budget branch and bound to follow, the heuristic only has to settle its bound
    // (the Lagrangian dual of the budget) and a good plan; the branching closes the rest.
    if (budget_branching && ho.stall_rounds <= 0) ho.stall_rounds = 50;
    const double heuristic_start = deadline.elapsed();
    if (options.verbose)
      std::fprintf(stderr, "[solve] greedy %s; the heuristic gets %.2fs\n",
                   beside ? "beside the heuristic" : fmt::format("first, in {:.2f}s", heuristic_start).c_str(),
                   ho.time_limit_s);
    SolveResult h = run_heuristic(problem, ho);
    if (net.valid()) net.get();
    merge_into(best, greedy, problem, 0.0);
    merge_into(best, h, problem, heuristic_start);
    if (budget_branching && !best.proven_optimal && !within_gap(best, options.gap_tolerance)) {
      SolveOptions bo = options;
      const double before = deadline.elapsed();
      bo.time_limit_s = std::max(0.0, options.time_limit_s - before);
      if (bo.work_limit > 0) bo.work_limit = std::max<int64_t>(1, bo.work_limit - best.work);
      SolveResult b;
      if (bo.time_limit_s > 0 && detail::solve_budget_branch(problem, bo, best.found ? &best.solution : nullptr, b)) {
        merge_into(best, b, problem, before);
        if (b.proven_optimal) best.proven_optimal = true;
      }
    }
  }
  // A heuristic whose dual bound meets its plan has already proven optimality.
  const bool already_proven =
      best.found && (best.proven_optimal || (!options.exact && within_gap(best, options.gap_tolerance)));
  if ((exact_only || options.exact) && !already_proven) {
    SolveOptions eo = options;
    double before = deadline.elapsed();
    eo.time_limit_s = std::max(0.0, options.time_limit_s - before);
    SolveResult ex = solve_exact(problem, eo, best.found ? &best.solution : nullptr);
    merge_into(best, ex, problem, before);
    best.proven_optimal = ex.proven_optimal;
  } else if (!already_proven) {
    best.lower_bound = std::max(best.lower_bound, simple_bound);
  }

  // Final, independent check: an invalid plan is never reported as found.
  if (best.found) {
    Evaluation ev = evaluate(problem, best.solution);
    best.found = ev.valid;
    best.cost = ev.cost;
    best.peak_usage = ev.peak_usage;
    if (!ev.valid) {
      best.proven_optimal = false;
      best.solution.clear();
    }
  }
  if (best.found) {
    best.lower_bound = std::min(best.lower_bound, best.cost);
    if (bound_proves_optimal(best.cost, best.lower_bound, has_integer_costs(problem))) best.proven_optimal = true;
    if (best.proven_optimal) {
      best.status = "optimal";
      best.lower_bound = best.cost;
    } else if (within_gap(best, options.gap_tolerance))
      best.status = "gap tolerance";
    // A later stage that found nothing must not label the plan an earlier stage found.
    else if (best.status.find("limit") == std::string::npos || best.status.find("no valid") != std::string::npos)
      best.status = "time limit (best plan so far)";
  } else {
    best.proven_optimal = false;
    best.proven_infeasible = best.status.rfind("infeasible", 0) == 0;
    if (!best.proven_infeasible) best.status = "no valid plan found within the time limit (infeasibility not proven)";
  }
  if (!std::isfinite(best.lower_bound) || best.lower_bound < -kInfeasibleCost) best.lower_bound = -kInfeasibleCost;
  best.total_time_s = deadline.elapsed();
  return best;
}

}  // namespace autoshard
