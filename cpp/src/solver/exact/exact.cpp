// solve_exact: warm start, then branch and bound; the result is re-evaluated independently.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"
#include "autoshard/reduce.h"
#include "exact/exact_search.h"

namespace autoshard {

SolveResult solve_exact(const Problem& problem, const SolveOptions& options, const Solution* warm_start) {
  detail::Deadline deadline;
  deadline.limit_s = options.time_limit_s;
  SolveResult r;
  // Optimum-preserving reductions first (infeasible/dominated strategies, memory-free leaves
  // and chains); the search runs on what remains and its plan is expanded back.
  Reduction red = reduce(problem);
  if (red.infeasible) {
    r.status = "infeasible (proven: " + red.infeasible_reason + ")";
    r.lower_bound = kInfeasibleCost;
    r.total_time_s = deadline.elapsed();
    return r;
  }
  const Problem& rp = red.reduced;
  const detail::GraphView g = detail::build_referencing_view(rp);  // `red` outlives it
  const int32_t n = g.num_nodes;

  std::vector<int32_t> incumbent(n, 0);
  double incumbent_cost = detail::kInf;
  auto offer = [&](const std::vector<int32_t>& plan) {
    Evaluation ev = evaluate(rp, plan);
    if (!ev.valid) return;
    double c = detail::graph_cost(g, plan);  // finite: the plan is valid
    if (c < incumbent_cost) {
      if (!std::isfinite(incumbent_cost)) r.time_to_first_s = deadline.elapsed();
      incumbent_cost = c;
      incumbent = plan;
    }
  };
  // A warm start for the original problem maps onto the reduced one when every choice survived.
  if (warm_start && warm_start->size() == problem.num_nodes()) {
    std::vector<int32_t> mapped(n, -1);
    for (int32_t i = 0; i < n; ++i) {
      const auto& strat = red.original_strategy[i];
      for (size_t k = 0; k < strat.size(); ++k)
        if (strat[k] == (*warm_start)[red.original_node[i]]) mapped[i] = static_cast<int32_t>(k);
    }
    if (std::find(mapped.begin(), mapped.end(), -1) == mapped.end()) offer(mapped);
  }
  detail::Deadline greedy_deadline = deadline;
  greedy_deadline.limit_s = options.time_limit_s * 0.2;
  for (const auto& plan : detail::greedy_plans(g, rp, greedy_deadline)) offer(plan);

  detail::ExactOutcome out = detail::branch_and_bound(g, has_integer_costs(rp), deadline, incumbent, incumbent_cost,
                                                      options.gap_tolerance, red.cost_offset);
  if (std::isfinite(out.cost)) {
    Solution full = red.expand(out.plan);
    Evaluation ev = evaluate(problem, full);
    if (ev.valid) {
      if (r.time_to_first_s < 0) r.time_to_first_s = deadline.elapsed();
      r.found = true;
      r.solution = std::move(full);
      r.cost = ev.cost;
      r.peak_usage = ev.peak_usage;
    }
  }
  // Complete with branches cut on the gap tolerance proves only their smallest bound.
  const bool within_tolerance = out.complete && std::isfinite(out.tolerance_bound) && out.tolerance_bound < out.cost;
  r.proven_optimal = out.complete && r.found && !within_tolerance;
  r.lower_bound = std::isfinite(out.lower_bound) ? out.lower_bound + red.cost_offset : kInfeasibleCost;
  if (r.found && r.lower_bound > r.cost) r.lower_bound = r.cost;
  if (out.complete && !r.found)
    r.status = "infeasible (proven: no plan satisfies every constraint)";
  else if (r.proven_optimal)
    r.status = "optimal";
  else if (within_tolerance && r.found)
    r.status = "gap tolerance";
  else
    r.status = r.found ? "time limit (best plan so far)" : "time limit (no valid plan found)";
  if (options.verbose)
    std::fprintf(stderr, "exact: reduced %zu -> %d nodes; %llu search nodes, complete=%d\n", problem.num_nodes(), n,
                 static_cast<unsigned long long>(out.nodes), out.complete ? 1 : 0);
  r.total_time_s = deadline.elapsed();
  return r;
}

}  // namespace autoshard
