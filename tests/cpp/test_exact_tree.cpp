// The exact solver on trees too large to enumerate, against dynamic programming on the tree
// (exact for a tree when the memory limit cannot bind). Usages and a generous limit keep
// the nodes out of the memory-free reductions, so the branch and bound itself is exercised.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"

using namespace autoshard;

namespace {

double tree_dp_optimum(const Problem& p, const std::vector<int>& parent) {
  const size_t n = p.num_nodes();
  std::vector<std::vector<int>> children(n);
  std::vector<int> edge_of(n, -1);
  for (size_t e = 0; e < p.edges.size(); ++e) edge_of[p.edges[e].v] = static_cast<int>(e);
  for (size_t v = 1; v < n; ++v) children[parent[v]].push_back(static_cast<int>(v));
  // best[v][s]: cheapest subtree of v with v at strategy s.
  std::vector<std::vector<double>> best(n);
  std::function<void(int)> visit = [&](int v) {
    best[v] = p.node_costs[v];
    for (int c : children[v]) {
      visit(c);
      const Edge& e = p.edges[edge_of[c]];  // edge (v -> c)
      for (size_t s = 0; s < best[v].size(); ++s) {
        double m = 1e300;
        for (size_t t = 0; t < best[c].size(); ++t) m = std::min(m, e.costs[s * best[c].size() + t] + best[c][t]);
        best[v][s] += m;
      }
    }
  };
  visit(0);
  return *std::min_element(best[0].begin(), best[0].end());
}

}  // namespace

TEST(ExactTree, ProvesTheTreeDpOptimumOnSixtyNodeTrees) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    std::mt19937 rng(seed);
    Problem p;
    const int n = 60;
    std::vector<int> parent(n, -1);
    p.node_costs.resize(n);
    p.node_usages.resize(n);
    p.intervals.resize(n);
    for (int i = 0; i < n; ++i) {
      int k = 1 + static_cast<int>(rng() % 4);
      for (int s = 0; s < k; ++s) {
        p.node_costs[i].push_back(static_cast<double>(rng() % 1000));
        p.node_usages[i].push_back(1 + static_cast<int64_t>(rng() % 5));
      }
      p.intervals[i] = {i, i + 3};
    }
    for (int v = 1; v < n; ++v) {
      parent[v] = static_cast<int>(rng() % v);
      Edge e{parent[v], v, {}};
      for (size_t x = 0; x < p.node_costs[parent[v]].size() * p.node_costs[v].size(); ++x)
        e.costs.push_back(static_cast<double>(rng() % 500));
      p.edges.push_back(e);
    }
    p.usage_limit = 1000;  // 3 live nodes x usage <= 5: never binds
    SolveOptions o;
    o.time_limit_s = 20;
    SolveResult r = solve_exact(p, o);
    ASSERT_TRUE(r.found) << "seed " << seed;
    EXPECT_TRUE(r.proven_optimal) << "seed " << seed;
    EXPECT_EQ(r.cost, tree_dp_optimum(p, parent)) << "seed " << seed;
    EXPECT_TRUE(evaluate(p, r.solution).valid);
  }
}
