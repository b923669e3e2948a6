// Plan evaluation by direct summation and an event sweep over time: no shared state with any
// solver, so a solver bug cannot hide behind the check.
#include "autoshard/evaluate.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace autoshard {

namespace {
int64_t saturating_add(int64_t a, int64_t b) {
  __int128 s = static_cast<__int128>(a) + b;
  if (s > std::numeric_limits<int64_t>::max()) return std::numeric_limits<int64_t>::max();
  if (s < std::numeric_limits<int64_t>::min()) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(s);
}
}  // namespace

int64_t peak_usage(const Problem& p, const Solution& sol, int64_t* peak_time) {
  // Events (time, delta); at equal times removals (end) come first because intervals are
  // half-open: a node ending at t and one starting at t are never live together.
  std::vector<std::pair<int64_t, int64_t>> events;
  for (size_t i = 0; i < p.num_nodes() && i < p.intervals.size(); ++i) {
    const Interval& iv = p.intervals[i];
    if (iv.end <= iv.start || i >= p.node_usages.size() || p.node_usages[i].empty()) continue;
    int64_t u = p.node_usages[i][sol[i]];
    if (u == 0) continue;
    events.emplace_back(iv.start, u);
    events.emplace_back(iv.end, -u);
  }
  std::sort(events.begin(), events.end());  // negative deltas sort first at equal time
  __int128 live = 0, peak = 0;
  int64_t at = 0;
  for (const auto& [t, d] : events) {
    live += d;
    if (live > peak) {
      peak = live;
      at = t;
    }
  }
  if (peak_time) *peak_time = at;
  if (peak > std::numeric_limits<int64_t>::max()) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(peak);
}

Evaluation evaluate(const Problem& p, const Solution& sol) {
  Evaluation ev;
  const size_t n = p.num_nodes();
  if (sol.size() != n) {
    ev.violation = "the plan has " + std::to_string(sol.size()) + " entries for " + std::to_string(n) + " nodes";
    return ev;
  }
  for (size_t i = 0; i < n; ++i) {
    if (sol[i] < 0 || static_cast<size_t>(sol[i]) >= p.num_strategies(i)) {
      ev.violation = "node " + std::to_string(i) + ": strategy " + std::to_string(sol[i]) + " out of range (" +
                     std::to_string(p.num_strategies(i)) + " strategies)";
      return ev;
    }
  }
  ev.well_formed = true;
  // Long double keeps integer totals exact well beyond 2^53 for reporting.
  long double total = 0;
  for (size_t i = 0; i < n; ++i) {
    Cost c = p.node_costs[i][sol[i]];
    if (is_infeasible(c) && !ev.takes_infeasible) {
      ev.takes_infeasible = true;
      ev.violation = "node " + std::to_string(i) + " takes infeasible strategy " + std::to_string(sol[i]);
    }
    total += c;
  }
  for (size_t e = 0; e < p.edges.size(); ++e) {
    const Edge& ed = p.edges[e];
    Cost c = ed.costs[static_cast<size_t>(sol[ed.u]) * p.num_strategies(ed.v) + sol[ed.v]];
    if (is_infeasible(c) && !ev.takes_infeasible) {
      ev.takes_infeasible = true;
      ev.violation = "edge " + std::to_string(e) + " (" + std::to_string(ed.u) + " -> " + std::to_string(ed.v) +
                     ") takes an infeasible entry";
    }
    total += c;
  }
  ev.cost = static_cast<Cost>(total);
  ev.peak_usage = peak_usage(p, sol, &ev.peak_time);
  ev.memory_ok = p.usage_limit < 0 || ev.peak_usage <= p.usage_limit;
  if (!ev.memory_ok && ev.violation.empty())
    ev.violation = "peak usage " + std::to_string(ev.peak_usage) + " at time " + std::to_string(ev.peak_time) +
                   " exceeds the limit " + std::to_string(p.usage_limit);
  for (size_t b = 0; b < p.budgets.size(); ++b) {
    const GlobalBudget& g = p.budgets[b];
    int64_t sum = 0;
    for (size_t i = 0; i < n && i < g.usage.size(); ++i)
      if (!g.usage[i].empty()) sum = saturating_add(sum, g.usage[i][sol[i]]);
    ev.budget_sums.push_back(sum);
    if (sum < g.low || sum > g.high) {
      if (ev.budgets_ok && ev.violation.empty())
        ev.violation = "budget " + (g.name.empty() ? std::to_string(b) : "'" + g.name + "'") + ": sum " +
                       std::to_string(sum) + " outside [" + std::to_string(g.low) + ", " + std::to_string(g.high) + "]";
      ev.budgets_ok = false;
    }
  }
  ev.valid = !ev.takes_infeasible && ev.memory_ok && ev.budgets_ok;
  return ev;
}

}  // namespace autoshard
