// Builds the solver's internal view of a problem (see exact_model.h).
#include "exact/exact_model.h"

#include <algorithm>
#include <map>

namespace autoshard::detail {

SolverModel build_model(const Problem& p) {
  SolverModel m;
  m.n = static_cast<int32_t>(p.num_nodes());
  m.cost.resize(m.n);
  m.usage.resize(m.n);
  for (int32_t i = 0; i < m.n; ++i) {
    const size_t k = p.num_strategies(i);
    m.cost[i].resize(k);
    for (size_t s = 0; s < k; ++s) m.cost[i][s] = is_infeasible(p.node_costs[i][s]) ? kInf : p.node_costs[i][s];
    m.usage[i].assign(k, 0);
    if (static_cast<size_t>(i) < p.node_usages.size() && !p.node_usages[i].empty()) m.usage[i] = p.node_usages[i];
  }
  // Parallel edges add up; a reversed edge is transposed into the (min, max) orientation.
  std::map<std::pair<int32_t, int32_t>, int32_t> pair_index;
  for (const Edge& e : p.edges) {
    const size_t su = p.num_strategies(e.u), sv = p.num_strategies(e.v);
    if (e.u == e.v) {
      for (size_t s = 0; s < su; ++s) {
        Cost c = e.costs[s * sv + s];
        m.cost[e.u][s] += is_infeasible(c) ? kInf : c;
      }
      continue;
    }
    int32_t a = std::min(e.u, e.v), b = std::max(e.u, e.v);
    auto [it, fresh] = pair_index.emplace(std::make_pair(a, b), static_cast<int32_t>(m.pairs.size()));
    if (fresh) {
      PairCosts pc;
      pc.a = a;
      pc.b = b;
      pc.m.assign(p.num_strategies(a) * p.num_strategies(b), 0.0);
      m.pairs.push_back(std::move(pc));
    }
    PairCosts& pc = m.pairs[it->second];
    const size_t sb = p.num_strategies(b);
    for (size_t x = 0; x < su; ++x)
      for (size_t y = 0; y < sv; ++y) {
        Cost c = e.costs[x * sv + y];
        double v = is_infeasible(c) ? kInf : c;
        size_t at = (e.u == a) ? x * sb + y : y * sb + x;
        pc.m[at] += v;
      }
  }
  m.adj.resize(m.n);
  for (int32_t k = 0; k < static_cast<int32_t>(m.pairs.size()); ++k) {
    m.adj[m.pairs[k].a].push_back({k, m.pairs[k].b, true});
    m.adj[m.pairs[k].b].push_back({k, m.pairs[k].a, false});
  }

  // Checkpoints: the live usage only rises at interval starts, so its maximum over time is
  // reached at one of them. Nodes whose usage is zero for every strategy never matter.
  m.limit = p.usage_limit;
  m.live_lo.assign(m.n, 0);
  m.live_hi.assign(m.n, 0);
  if (m.limit >= 0 && !p.intervals.empty()) {
    std::vector<int64_t> starts;
    for (int32_t i = 0; i < m.n; ++i) {
      const Interval& iv = p.intervals[i];
      bool uses = std::any_of(m.usage[i].begin(), m.usage[i].end(), [](int64_t u) { return u > 0; });
      if (iv.end > iv.start && uses) starts.push_back(iv.start);
    }
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    m.checkpoints = starts;
    for (int32_t i = 0; i < m.n; ++i) {
      const Interval& iv = p.intervals[i];
      bool uses = std::any_of(m.usage[i].begin(), m.usage[i].end(), [](int64_t u) { return u > 0; });
      if (!(iv.end > iv.start && uses)) continue;
      m.live_lo[i] = static_cast<int32_t>(std::lower_bound(starts.begin(), starts.end(), iv.start) - starts.begin());
      m.live_hi[i] = static_cast<int32_t>(std::lower_bound(starts.begin(), starts.end(), iv.end) - starts.begin());
    }
  }
  for (const GlobalBudget& g : p.budgets) {
    BudgetRows br;
    br.low = g.low;
    br.high = g.high;
    br.usage.resize(m.n);
    for (int32_t i = 0; i < m.n; ++i) {
      br.usage[i].assign(m.strategies(i), 0);
      if (static_cast<size_t>(i) < g.usage.size() && !g.usage[i].empty()) br.usage[i] = g.usage[i];
    }
    m.budgets.push_back(std::move(br));
  }
  m.integer_costs = has_integer_costs(p);
  return m;
}

double model_cost(const SolverModel& m, const std::vector<int32_t>& plan) {
  double total = 0;
  for (int32_t i = 0; i < m.n; ++i) total += m.cost[i][plan[i]];
  for (const PairCosts& pc : m.pairs) total += pc.m[static_cast<size_t>(plan[pc.a]) * m.cost[pc.b].size() + plan[pc.b]];
  return total;
}

}  // namespace autoshard::detail
