// The invariants every solver relies on, checked wherever a problem comes from (a file, the
// lowering, a test), and the integrality test the solvers' bounds use.
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "autoshard/problem.h"

namespace autoshard {

namespace {

// Every message starts with the source so that a user with many files knows which one.
[[noreturn]] void fail(const std::string& source, const std::string& msg) { throw ProblemError(source + ": " + msg); }

}  // namespace

void validate_problem(const Problem& p, const std::string& source) {
  const size_t n = p.num_nodes();
  for (size_t i = 0; i < n; ++i) {
    if (p.node_costs[i].empty())
      fail(source, "node " + std::to_string(i) + " has no strategies; every node needs at least one");
    for (size_t s = 0; s < p.node_costs[i].size(); ++s)
      if (std::isnan(p.node_costs[i][s]))
        fail(source, "node " + std::to_string(i) + " strategy " + std::to_string(s) + ": cost is NaN");
  }
  if (p.node_usages.size() != n && !p.node_usages.empty())
    fail(source,
         "node_usages has " + std::to_string(p.node_usages.size()) + " rows for " + std::to_string(n) + " nodes");
  for (size_t i = 0; i < p.node_usages.size(); ++i) {
    if (!p.node_usages[i].empty() && p.node_usages[i].size() != p.node_costs[i].size())
      fail(source, "node " + std::to_string(i) + ": " + std::to_string(p.node_usages[i].size()) + " usages for " +
                       std::to_string(p.node_costs[i].size()) + " strategies");
    for (int64_t u : p.node_usages[i])
      if (u < 0) fail(source, "node " + std::to_string(i) + ": negative usage " + std::to_string(u));
  }
  if (p.intervals.size() != n && !p.intervals.empty())
    fail(source,
         "intervals has " + std::to_string(p.intervals.size()) + " entries for " + std::to_string(n) + " nodes");
  for (size_t i = 0; i < p.intervals.size(); ++i)
    if (p.intervals[i].end < p.intervals[i].start)
      fail(source, "node " + std::to_string(i) + ": interval end " + std::to_string(p.intervals[i].end) + " < start " +
                       std::to_string(p.intervals[i].start));
  for (size_t e = 0; e < p.edges.size(); ++e) {
    const Edge& ed = p.edges[e];
    if (ed.u < 0 || static_cast<size_t>(ed.u) >= n || ed.v < 0 || static_cast<size_t>(ed.v) >= n)
      fail(source, "edge " + std::to_string(e) + ": node id out of range (" + std::to_string(ed.u) + ", " +
                       std::to_string(ed.v) + ") for " + std::to_string(n) + " nodes");
    size_t want = p.node_costs[ed.u].size() * p.node_costs[ed.v].size();
    if (ed.costs.size() != want)
      fail(source, "edge " + std::to_string(e) + " (" + std::to_string(ed.u) + " -> " + std::to_string(ed.v) +
                       "): " + std::to_string(ed.costs.size()) + " costs, expected " +
                       std::to_string(p.node_costs[ed.u].size()) + " x " + std::to_string(p.node_costs[ed.v].size()) +
                       " = " + std::to_string(want));
  }
  for (size_t b = 0; b < p.budgets.size(); ++b) {
    const GlobalBudget& g = p.budgets[b];
    if (g.usage.size() != n && !g.usage.empty())
      fail(source, "budget " + std::to_string(b) + ": " + std::to_string(g.usage.size()) + " rows for " +
                       std::to_string(n) + " nodes");
    for (size_t i = 0; i < g.usage.size(); ++i) {
      if (!g.usage[i].empty() && g.usage[i].size() != p.node_costs[i].size())
        fail(source, "budget " + std::to_string(b) + " node " + std::to_string(i) + ": wrong number of usages");
      for (int64_t u : g.usage[i])
        if (u < 0) fail(source, "budget " + std::to_string(b) + " node " + std::to_string(i) + ": negative usage");
    }
    if (g.low > g.high) fail(source, "budget " + std::to_string(b) + ": low > high");
  }
  // Every partial sum of a plan's finite costs is at most this bound; at most 2^53 keeps them
  // all exact, so plans are compared and printed exactly.
  long double most = 0;
  auto largest_finite = [](const std::vector<Cost>& row) {
    Cost m = 0;
    for (Cost c : row)
      if (!is_infeasible(c)) m = std::max(m, std::fabs(c));
    return m;
  };
  for (const auto& row : p.node_costs) most += largest_finite(row);
  for (const Edge& e : p.edges) most += largest_finite(e.costs);
  if (most > static_cast<long double>(kMaxExactCost)) {
    fail(source, fmt::format("the finite costs of one plan can add up to {:.4g}", most) +
                     " (the largest finite cost of every node and edge), above 2^53 = 9007199254740992, where the "
                     "solver's doubles stop being exact and plans could be ordered wrongly; divide every cost by a "
                     "common factor");
  }
  if (!p.node_names.empty() && p.node_names.size() != n)
    fail(source,
         "node_names has " + std::to_string(p.node_names.size()) + " entries for " + std::to_string(n) + " nodes");
}

bool has_integer_costs(const Problem& p) {
  auto integral = [](const std::vector<Cost>& row) {
    for (Cost c : row)
      if (!is_infeasible(c) && std::nearbyint(c) != c) return false;
    return true;
  };
  for (const auto& row : p.node_costs)
    if (!integral(row)) return false;
  for (const Edge& e : p.edges)
    if (!integral(e.costs)) return false;
  return true;
}

}  // namespace autoshard
