// solve_exact: warm start, then branch and bound; the result is re-evaluated independently.
#include <cmath>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"
#include "exact_search.h"

namespace autoshard {

SolveResult solve_exact(const Problem& problem, const SolveOptions& options, const Solution* warm_start) {
  detail::Deadline deadline;
  deadline.limit_s = options.time_limit_s;
  SolveResult r;
  detail::SolverModel m = detail::build_model(problem);

  std::vector<int32_t> incumbent(m.n, 0);
  double incumbent_cost = detail::kInf;
  auto offer = [&](const std::vector<int32_t>& plan) {
    Evaluation ev = evaluate(problem, plan);
    if (!ev.valid) return;
    double c = detail::model_cost(m, plan);
    if (c < incumbent_cost) {
      if (!std::isfinite(incumbent_cost)) r.time_to_first_s = deadline.elapsed();
      incumbent_cost = c;
      incumbent = plan;
    }
  };
  if (warm_start && warm_start->size() == static_cast<size_t>(m.n)) offer(*warm_start);
  detail::Deadline greedy_deadline = deadline;
  greedy_deadline.limit_s = options.time_limit_s * 0.2;
  for (const auto& plan : detail::greedy_plans(m, greedy_deadline)) offer(plan);

  detail::ExactOutcome out = detail::branch_and_bound(m, deadline, incumbent, incumbent_cost);
  if (std::isfinite(out.cost)) {
    Evaluation ev = evaluate(problem, out.plan);
    if (ev.valid) {
      if (r.time_to_first_s < 0) r.time_to_first_s = deadline.elapsed();
      r.found = true;
      r.solution = out.plan;
      r.cost = ev.cost;
      r.peak_usage = ev.peak_usage;
    }
  }
  r.proven_optimal = out.complete && r.found;
  r.lower_bound = std::isfinite(out.lower_bound) ? out.lower_bound : kInfeasibleCost;
  if (r.found && r.lower_bound > r.cost) r.lower_bound = r.cost;
  if (out.complete && !r.found) r.status = "infeasible (proven: no plan satisfies every constraint)";
  else if (r.proven_optimal) r.status = "optimal";
  else r.status = r.found ? "time limit (best plan so far)" : "time limit (no valid plan found)";
  if (options.verbose)
    std::fprintf(stderr, "exact: %llu search nodes, complete=%d\n", static_cast<unsigned long long>(out.nodes),
                 out.complete ? 1 : 0);
  r.total_time_s = deadline.elapsed();
  return r;
}

}  // namespace autoshard
