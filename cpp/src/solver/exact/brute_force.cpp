// Ground truth for tests: every plan is enumerated and judged by evaluate() alone.
#include <stdexcept>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"

namespace autoshard {

SolveResult solve_brute_force(const Problem& problem, uint64_t max_plans) {
  const size_t n = problem.num_nodes();
  uint64_t plans = 1;
  for (size_t i = 0; i < n; ++i) {
    plans *= problem.num_strategies(i);
    if (plans > max_plans)
      throw std::invalid_argument("brute force: more than " + std::to_string(max_plans) + " plans; use solve_exact");
  }
  SolveResult r;
  Solution plan(n, 0);
  while (true) {
    Evaluation ev = evaluate(problem, plan);
    if (ev.valid && (!r.found || ev.cost < r.cost)) {
      r.found = true;
      r.cost = ev.cost;
      r.solution = plan;
      r.peak_usage = ev.peak_usage;
    }
    size_t i = 0;
    while (i < n && ++plan[i] == static_cast<int32_t>(problem.num_strategies(i))) plan[i++] = 0;
    if (i == n) break;
  }
  r.proven_optimal = r.found;
  r.lower_bound = r.found ? r.cost : kInfeasibleCost;
  r.status = r.found ? "optimal" : "infeasible";
  return r;
}

}  // namespace autoshard
