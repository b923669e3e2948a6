// The MILP (solver/milp.h) against brute force: random problems with infeasible entries,
// parallel and reversed edges, memory limits and global budgets; with and without a start.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>

#include "autoshard/clock.h"
#include "autoshard/problem.h"
#include "autoshard/solver.h"
#include "solver/graph_view.h"
#include "solver/heuristic/milp.h"
#include "test_heuristic_util.h"

namespace autoshard {
namespace {

using namespace testing_util;

void expect_matches_brute_force(const Problem& p, const Brute& b, const SolveResult& r, int trial) {
  ASSERT_EQ(r.found, b.feasible) << "trial " << trial << ": " << r.status;
  if (!b.feasible) return;
  Cost cost = 0;
  ASSERT_TRUE(plan_valid(p, r.solution, &cost)) << "trial " << trial;
  EXPECT_EQ(cost, b.best) << "trial " << trial;
  // The bound proves it: integer costs, so within one unit.
  EXPECT_LE(r.lower_bound, b.best + 1e-6) << "trial " << trial;
  EXPECT_TRUE(bound_proves_optimal(cost, r.lower_bound, true)) << "trial " << trial << ": bound " << r.lower_bound;
}

TEST(Milp, RandomProblemsMatchBruteForce) {
  std::mt19937_64 rng(20261124);
  int feasible = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const Problem p = random_problem(rng, 4 + trial % 5, 4, trial % 3 == 0);
    const Brute b = brute_force(p);
    feasible += b.feasible;
    SolveOptions o;
    o.time_limit_s = 10;
    const SolveResult r = detail::solve_milp(detail::build_graph_view(p), p.usage_limit, true, o, nullptr);
    expect_matches_brute_force(p, b, r, trial);
  }
  EXPECT_GT(feasible, 50);  // the generator makes both kinds
}

TEST(Milp, StartsFromAGivenPlan) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const Problem p = random_problem(rng, 6, 4, trial % 2 == 0);
    const Brute b = brute_force(p);
    if (!b.feasible) continue;
    SolveOptions o;
    o.time_limit_s = 10;
    const SolveResult r = detail::solve_milp(detail::build_graph_view(p), p.usage_limit, true, o, &b.plan);
    expect_matches_brute_force(p, b, r, trial);
  }
}

TEST(Milp, DispatcherProvesADenseProblemOptimal) {
  // A 7x7 grid, 10 strategies per node, random dense edge costs: too many plans for the
  // exact search to enumerate, and a loopy graph where the heuristic's bound keeps a gap
  // (measured: ~1 % after its 40 % of the time); the MILP after it closes the gap. The limit
  // leaves room for a machine a few times slower.
  std::mt19937_64 rng(11);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int side = 7, labels = 10;
  Problem p;
  p.node_costs.assign(side * side, {});
  for (auto& row : p.node_costs)
    for (int s = 0; s < labels; ++s) row.push_back(uni(0, 50));
  auto edge = [&](int u, int v) {
    Edge e{u, v, {}};
    for (int k = 0; k < labels * labels; ++k) e.costs.push_back(uni(0, 50));
    p.edges.push_back(std::move(e));
  };
  for (int r = 0; r < side; ++r)
    for (int c = 0; c < side; ++c) {
      if (c + 1 < side) edge(r * side + c, r * side + c + 1);
      if (r + 1 < side) edge(r * side + c, (r + 1) * side + c);
    }
  SolveOptions o;
  o.time_limit_s = 20;
  const SolveResult m = detail::solve_milp(detail::build_graph_view(p), -1, true, o, nullptr);
  ASSERT_TRUE(m.found);
  // One thread: the MILP after the search's share; two: beside the search, from the start.
  for (int threads : {1, 2}) {
    o.threads = threads;
    const SolveResult r = solve(p, o);
    ASSERT_TRUE(r.found);
    EXPECT_TRUE(r.proven_optimal) << threads << " threads: " << r.status << ", cost " << r.cost << ", bound "
                                  << r.lower_bound;
    EXPECT_EQ(r.cost, m.cost) << threads << " threads";
  }
}

TEST(Milp, StopsWhenInterrupted) {
  std::mt19937_64 rng(3);
  const Problem p = random_problem(rng, 8, 4, false);
  SolveOptions o;
  o.time_limit_s = 30;
  const std::atomic<bool> proven_elsewhere{true};
  const auto t0 = Clock::now();
  const SolveResult r =
      detail::solve_milp(detail::build_graph_view(p), p.usage_limit, true, o, nullptr, &proven_elsewhere);
  EXPECT_LT(seconds_since(t0), 5.0);
  if (r.found) EXPECT_TRUE(plan_valid(p, r.solution, nullptr));
}

}  // namespace
}  // namespace autoshard
