// The exact solver against brute-force enumeration on many random small problems: DAGs,
// trees, cycles, parallel and reversed edges, infeasible entries, tight memory limits and
// global budgets. Both must agree on feasibility and on the optimal cost.
#include <gtest/gtest.h>

#include <random>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"
#include "autoshard/solver.h"

using namespace autoshard;

namespace {

enum class Shape { Dag, Tree, Cycle, Dense };

Problem random_problem(uint32_t seed, Shape shape, bool tight_memory, bool budget) {
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  const int n = uni(1, 8);
  p.node_costs.resize(n);
  p.node_usages.resize(n);
  p.intervals.resize(n);
  for (int i = 0; i < n; ++i) {
    int k = uni(1, 4);
    for (int s = 0; s < k; ++s) {
      p.node_costs[i].push_back(uni(0, 9) == 0 ? kInfeasibleCost : uni(0, 100));
      p.node_usages[i].push_back(uni(0, 10));
    }
    int a = uni(0, 6);
    p.intervals[i] = {a, a + uni(0, 4)};
  }
  auto add_edge = [&](int u, int v) {
    Edge e{u, v, {}};
    for (size_t x = 0; x < p.node_costs[u].size() * p.node_costs[v].size(); ++x)
      e.costs.push_back(uni(0, 7) == 0 ? kInfeasibleCost : uni(0, 50));
    p.edges.push_back(std::move(e));
  };
  for (int v = 1; v < n; ++v) {
    switch (shape) {
      case Shape::Tree:
        add_edge(uni(0, v - 1), v);
        break;
      case Shape::Cycle:
        add_edge(v - 1, v);
        break;
      case Shape::Dag:
        for (int u = 0; u < v; ++u)
          if (uni(0, 2) == 0) add_edge(u, v);
        break;
      case Shape::Dense:
        for (int u = 0; u < v; ++u) add_edge(uni(0, 1) ? u : v, uni(0, 1) ? v : u);  // reversed/self edges too
        break;
    }
  }
  if (shape == Shape::Cycle && n >= 3) add_edge(n - 1, 0);
  if (shape == Shape::Dense && n >= 2) add_edge(0, 1);  // a parallel edge
  if (tight_memory)
    p.usage_limit = uni(3, 20);
  else if (uni(0, 1))
    p.usage_limit = 1000;
  if (budget) {
    GlobalBudget g;
    g.name = "params";
    for (int i = 0; i < n; ++i) {
      g.usage.emplace_back();
      for (size_t s = 0; s < p.node_costs[i].size(); ++s) g.usage[i].push_back(uni(0, 6));
    }
    g.low = uni(0, 2 * n);
    g.high = g.low + uni(0, 3 * n);
    p.budgets.push_back(std::move(g));
  }
  return p;
}

}  // namespace

TEST(ExactRandom, MatchesBruteForceOnManySmallProblems) {
  int compared = 0, feasible = 0;
  for (uint32_t seed = 1; seed <= 1200; ++seed) {
    Shape shape = static_cast<Shape>(seed % 4);
    bool tight = (seed / 4) % 2 == 1;
    bool budget = (seed / 8) % 3 == 2;
    Problem p = random_problem(seed, shape, tight, budget);
    SolveResult truth = solve_brute_force(p);
    SolveOptions o;
    o.time_limit_s = 10;
    SolveResult ex = solve_exact(p, o);
    ASSERT_EQ(ex.found, truth.found) << "seed " << seed;
    ++compared;
    if (!truth.found) {
      EXPECT_FALSE(ex.proven_optimal);
      continue;
    }
    ++feasible;
    EXPECT_TRUE(ex.proven_optimal) << "seed " << seed;
    EXPECT_EQ(ex.cost, truth.cost) << "seed " << seed;
    EXPECT_LE(ex.lower_bound, truth.cost) << "seed " << seed;
    Evaluation ev = evaluate(p, ex.solution);
    EXPECT_TRUE(ev.valid) << "seed " << seed << ": " << ev.violation;
    EXPECT_EQ(ev.cost, truth.cost);
    // The public dispatcher takes the exact path on problems this small.
    SolveResult via_solve = solve(p, o);
    ASSERT_TRUE(via_solve.found) << "seed " << seed;
    EXPECT_EQ(via_solve.cost, truth.cost) << "seed " << seed;
    EXPECT_TRUE(via_solve.proven_optimal);
  }
  EXPECT_EQ(compared, 1200);
  EXPECT_GT(feasible, 300);  // the generator must produce enough feasible cases to mean something
}

TEST(ExactRandom, ExactSearchOnLargerProblemsIsNeverWorseThanGreedyAndNeverInvalid) {
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    std::mt19937 rng(seed);
    Problem p;
    const int n = 40;
    p.node_costs.resize(n);
    p.node_usages.resize(n);
    p.intervals.resize(n);
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < 3; ++s) {
        p.node_costs[i].push_back(static_cast<double>(rng() % 100));
        p.node_usages[i].push_back(rng() % 10);
      }
      int64_t a = rng() % 30;
      p.intervals[i] = {a, a + static_cast<int64_t>(rng() % 8)};
    }
    for (int v = 1; v < n; ++v) {
      Edge e{static_cast<int32_t>(rng() % v), v, {}};
      for (int x = 0; x < 9; ++x) e.costs.push_back(static_cast<double>(rng() % 60));
      p.edges.push_back(e);
    }
    p.usage_limit = 25;
    SolveOptions o;
    o.time_limit_s = 0.5;
    SolveResult g = solve_greedy(p, o);
    SolveResult ex = solve_exact(p, o);
    if (g.found) {
      ASSERT_TRUE(ex.found);
      EXPECT_LE(ex.cost, g.cost);
    }
    if (ex.found) {
      EXPECT_TRUE(evaluate(p, ex.solution).valid);
      EXPECT_LE(ex.lower_bound, ex.cost);
    }
  }
}
