// Determinism of the large-problem search: with a work limit, runs are bit-identical (same
// plan, cost and counted work), for one thread and for a portfolio of several; a portfolio's
// plan is valid and its bound never exceeds it.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "autoshard/evaluate.h"
#include "autoshard/solver.h"

using namespace autoshard;

namespace {

// Large enough that the dispatcher uses the heuristic and the search does not finish by a
// proof before the work limit.
Problem search_sized_problem(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int n = 1500;
  Problem p;
  p.node_costs.resize(n);
  p.node_usages.resize(n);
  p.intervals.resize(n);
  int64_t peak_of_smallest = 0;
  for (int i = 0; i < n; ++i) {
    const int S = uni(2, 6);
    for (int s = 0; s < S; ++s) {
      p.node_costs[i].push_back(uni(0, 100));
      p.node_usages[i].push_back(uni(1, 20));
    }
    const int a = i / 3;  // a sliding window of live nodes, like activations along a graph
    p.intervals[i] = {a, a + uni(1, 40)};
  }
  for (int i = 1; i < n; ++i) {
    for (int k = 0; k < 1 + (uni(0, 3) == 0); ++k) {
      const int j = std::max(0, i - uni(1, 8));
      Edge e{j, i, {}};
      for (size_t q = 0; q < p.node_costs[j].size() * p.node_costs[i].size(); ++q) e.costs.push_back(uni(0, 60));
      p.edges.push_back(std::move(e));
    }
  }
  // A limit a little above the peak when every node takes its smallest usage: binding.
  for (int t = 0; t < n; ++t) {
    int64_t live = 0;
    for (int i = std::max(0, 3 * (t - 40)); i < n && p.intervals[i].start <= t; ++i)
      if (t < p.intervals[i].end) live += *std::min_element(p.node_usages[i].begin(), p.node_usages[i].end());
    peak_of_smallest = std::max(peak_of_smallest, live);
  }
  p.usage_limit = peak_of_smallest + peak_of_smallest / 4;
  return p;
}

SolveResult solve_with_work_limit(const Problem& p, int threads, int64_t work_limit) {
  SolveOptions o;
  o.time_limit_s = 120;  // far beyond what the work limit needs: the work limit stops it
  o.threads = threads;
  o.work_limit = work_limit;
  return solve(p, o);
}

}  // namespace

TEST(SolveDeterminism, SameWorkLimitSamePlan) {
  const Problem p = search_sized_problem(5);
  for (int threads : {1, 2}) {
    const SolveResult a = solve_with_work_limit(p, threads, 20'000'000);
    const SolveResult b = solve_with_work_limit(p, threads, 20'000'000);
    ASSERT_TRUE(a.found) << a.status;
    ASSERT_TRUE(b.found) << b.status;
    EXPECT_EQ(a.solution, b.solution) << threads << " thread(s)";
    EXPECT_EQ(a.cost, b.cost);
    EXPECT_EQ(a.work, b.work);
    EXPECT_EQ(a.lower_bound, b.lower_bound);
    EXPECT_GT(a.work, 0);
    const Evaluation ev = evaluate(p, a.solution);
    EXPECT_TRUE(ev.valid) << ev.violation;
    EXPECT_EQ(ev.cost, a.cost);
    EXPECT_LE(a.lower_bound, a.cost);
  }
}

TEST(SolveDeterminism, WorkLimitStopsTheSearch) {
  const Problem p = search_sized_problem(9);
  const SolveResult small = solve_with_work_limit(p, 1, 5'000'000);
  const SolveResult large = solve_with_work_limit(p, 1, 50'000'000);
  ASSERT_TRUE(small.found);
  ASSERT_TRUE(large.found);
  // The problem is hard enough that no proof ends the search early: the work limit does.
  // The larger budget does more work and, being the same trajectory run further, never
  // ends with a worse plan.
  ASSERT_FALSE(small.proven_optimal);
  EXPECT_EQ(small.status, "work limit");
  EXPECT_GE(small.work, 5'000'000);
  EXPECT_GT(large.work, small.work);
  EXPECT_LE(large.cost, small.cost);
}
