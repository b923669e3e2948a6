// Temporary: a trivially valid-if-possible solver (per-node cheapest finite strategy) so the
// sharding model can run end to end before the real solver lands. Replaced by solve.cpp.
#include "autoshard/solver.h"

namespace autoshard {
SolveResult solve(const Problem& p, const SolveOptions&) {
  SolveResult r;
  r.solution.assign(p.num_nodes(), 0);
  for (size_t i = 0; i < p.num_nodes(); ++i) {
    Cost best = kInfeasibleCost;
    for (size_t s = 0; s < p.node_costs[i].size(); ++s)
      if (p.node_costs[i][s] < best) { best = p.node_costs[i][s]; r.solution[i] = static_cast<int32_t>(s); }
  }
  r.status = "stub";
  return r;
}
}  // namespace autoshard
