// Shared by the heuristic and reduction tests: an independent brute force (every plan
// enumerated, memory checked at every integer time point) and a random problem generator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>

#include "autoshard/problem.h"

namespace autoshard::testing_util {

// Everything the brute force needs, written independently of the solver code.
struct Brute {
  bool feasible = false;
  Cost best = 0;
  Solution plan;
};

inline bool plan_valid(const Problem& p, const Solution& x, Cost* cost_out) {
  Cost cost = 0;
  for (size_t i = 0; i < p.num_nodes(); ++i) {
    if (is_infeasible(p.node_costs[i][x[i]])) return false;
    cost += p.node_costs[i][x[i]];
  }
  for (const Edge& e : p.edges) {
    const Cost c = e.costs[size_t(x[e.u]) * p.node_costs[e.v].size() + x[e.v]];
    if (is_infeasible(c)) return false;
    cost += c;
  }
  if (p.usage_limit >= 0) {
    int64_t t_max = 0;
    for (const Interval& iv : p.intervals) t_max = std::max(t_max, iv.end);
    for (int64_t t = 0; t < t_max; ++t) {
      int64_t live = 0;
      for (size_t i = 0; i < p.num_nodes(); ++i)
        if (p.intervals[i].start <= t && t < p.intervals[i].end && !p.node_usages[i].empty())
          live += p.node_usages[i][x[i]];
      if (live > p.usage_limit) return false;
    }
  }
  for (const GlobalBudget& b : p.budgets) {
    int64_t sum = 0;
    for (size_t i = 0; i < p.num_nodes(); ++i)
      if (!b.usage[i].empty()) sum += b.usage[i][x[i]];
    if (sum < b.low || sum > b.high) return false;
  }
  if (cost_out) *cost_out = cost;
  return true;
}

inline Brute brute_force(const Problem& p) {
  Brute out;
  const size_t n = p.num_nodes();
  Solution x(n, 0);
  while (true) {
    Cost c;
    if (plan_valid(p, x, &c) && (!out.feasible || c < out.best)) {
      out.feasible = true;
      out.best = c;
      out.plan = x;
    }
    size_t k = 0;
    while (k < n && ++x[k] == int32_t(p.node_costs[k].size())) x[k++] = 0;
    if (k == n) break;
  }
  return out;
}

// Random problem: a random tree plus extra (sometimes parallel, sometimes reversed) edges.
inline Problem random_problem(std::mt19937_64& rng, int n, int max_labels, bool budgets) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  p.node_costs.resize(n);
  p.node_usages.resize(n);
  p.intervals.resize(n);
  for (int i = 0; i < n; ++i) {
    const int S = uni(1, max_labels);
    const bool memory_free = uni(0, 3) == 0;
    for (int s = 0; s < S; ++s) {
      p.node_costs[i].push_back(uni(0, 9) == 0 ? kInfeasibleCost : Cost(uni(0, 30)));
      if (!memory_free) p.node_usages[i].push_back(uni(0, 10));
    }
    const int a = uni(0, 6), len = uni(0, 4);
    p.intervals[i] = {a, a + len};
  }
  auto add_edge = [&](int u, int v) {
    Edge e;
    e.u = u;
    e.v = v;
    for (size_t k = 0; k < p.node_costs[u].size() * p.node_costs[v].size(); ++k)
      e.costs.push_back(uni(0, 11) == 0 ? kInfeasibleCost : Cost(uni(0, 20)));
    p.edges.push_back(std::move(e));
  };
  for (int i = 1; i < n; ++i) {
    const int j = uni(0, i - 1);
    uni(0, 1) ? add_edge(j, i) : add_edge(i, j);
  }
  const int extra = uni(0, n / 2);
  for (int k = 0; k < extra; ++k) {
    const int u = uni(0, n - 1), v = uni(0, n - 1);
    if (u != v) add_edge(u, v);
  }
  // A limit between the smallest and the largest possible peak.
  int64_t lo = 0, hi = 0;
  for (int t = 0; t < 12; ++t) {
    int64_t mn = 0, mx = 0;
    for (int i = 0; i < n; ++i) {
      if (p.intervals[i].start <= t && t < p.intervals[i].end && !p.node_usages[i].empty()) {
        mn += *std::min_element(p.node_usages[i].begin(), p.node_usages[i].end());
        mx += *std::max_element(p.node_usages[i].begin(), p.node_usages[i].end());
      }
    }
    lo = std::max(lo, mn);
    hi = std::max(hi, mx);
  }
  p.usage_limit = uni(0, 4) == 0 ? -1 : lo + (hi - lo) * uni(0, 10) / 10;
  if (budgets && uni(0, 1)) {
    GlobalBudget b;
    b.name = "params";
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> row;
      if (uni(0, 2))
        for (size_t s = 0; s < p.node_costs[i].size(); ++s) row.push_back(uni(0, 5));
      for (auto v : row) total += v;
      b.usage.push_back(row);
    }
    b.low = uni(0, 2) ? 0 : total / 8;
    b.high = total / 3 + 1;
    p.budgets.push_back(b);
  }
  return p;
}

}  // namespace autoshard::testing_util
