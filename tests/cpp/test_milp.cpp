// The MILP (solver/milp.h) against brute force: random problems with infeasible entries,
// parallel and reversed edges, memory limits and global budgets; with and without a start.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "autoshard/clock.h"
#include "autoshard/problem.h"
#include "autoshard/solver.h"
#include "solver/graph_view.h"
#include "solver/heuristic/graph_clusters.h"
#include "solver/heuristic/milp.h"
#include "test_heuristic_util.h"

namespace autoshard {
namespace {

using namespace testing_util;

// The MILP over the problem's own clusters.
SolveResult milp_of(const Problem& p, int64_t usage_limit, bool integer_costs, const SolveOptions& o,
                    const Solution* start, const std::atomic<bool>* interrupt = nullptr,
                    int64_t eager_memory_nonzeros = 1'000'000) {
  const detail::GraphView g = detail::build_graph_view(p);
  return detail::solve_milp(g, detail::find_clusters(g), usage_limit, integer_costs, o, start, interrupt,
                            eager_memory_nonzeros);
}

// Ties nodes into clusters as the XLA graphs do: chains of nodes with the same label count
// joined by bijective edges (a permutation of finite entries, every other entry infeasible),
// each chain with its own memory interval per node, plus dense random edges between chains.
Problem clustered_problem(std::mt19937_64& rng, int chains, int length, int labels) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  const int n = chains * length;
  p.node_costs.resize(n);
  p.node_usages.resize(n);
  p.intervals.resize(n);
  for (int i = 0; i < n; ++i) {
    for (int s = 0; s < labels; ++s) {
      p.node_costs[i].push_back(uni(0, 12) == 0 ? kInfeasibleCost : Cost(uni(0, 30)));
      p.node_usages[i].push_back(uni(0, 10));
    }
    const int start = uni(0, 8);
    p.intervals[i] = {start, start + uni(1, 5)};
  }
  for (int c = 0; c < chains; ++c)
    for (int k = 0; k + 1 < length; ++k) {
      std::vector<int> perm(labels);
      for (int s = 0; s < labels; ++s) perm[s] = s;
      std::shuffle(perm.begin(), perm.end(), rng);
      Edge e{c * length + k, c * length + k + 1, std::vector<Cost>(size_t(labels) * labels, kInfeasibleCost)};
      for (int s = 0; s < labels; ++s) e.costs[size_t(s) * labels + perm[s]] = uni(0, 5);
      p.edges.push_back(std::move(e));
    }
  for (int k = 0; k < chains + 1; ++k) {
    const int u = uni(0, n - 1), v = uni(0, n - 1);
    if (u == v) continue;
    Edge e{u, v, {}};
    for (int s = 0; s < labels * labels; ++s) e.costs.push_back(uni(0, 20));
    p.edges.push_back(std::move(e));
  }
  p.usage_limit = uni(10, 30);
  return p;
}

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
    const SolveResult r = milp_of(p, p.usage_limit, true, o, nullptr);
    expect_matches_brute_force(p, b, r, trial);
  }
  EXPECT_GT(feasible, 50);  // the generator makes both kinds
}

TEST(Milp, ClusteredProblemsMatchBruteForceWithLazyMemoryRows) {
  // The model over clusters (a few root labels per chain) must give the optimum of the whole
  // problem, with the memory rows in the model from the start and added only where plans
  // break them (eager threshold 0).
  std::mt19937_64 rng(20261128);
  int feasible = 0, clustered = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const Problem p = clustered_problem(rng, 2 + trial % 2, 3, 3);
    const detail::GraphView g = detail::build_graph_view(p);
    clustered += detail::find_clusters(g).num_clusters() < g.num_nodes;
    const Brute b = brute_force(p);
    feasible += b.feasible;
    SolveOptions o;
    o.time_limit_s = 10;
    for (int64_t eager : {int64_t(1'000'000), int64_t(0)}) {
      const SolveResult r = milp_of(p, p.usage_limit, true, o, nullptr, nullptr, eager);
      expect_matches_brute_force(p, b, r, trial);
    }
    if (b.feasible) {
      const SolveResult r = milp_of(p, p.usage_limit, true, o, &b.plan, nullptr, 0);
      expect_matches_brute_force(p, b, r, trial);
    }
  }
  EXPECT_GT(feasible, 15);
  EXPECT_EQ(clustered, 60);
}

TEST(Milp, SizeCountsTheModelOverClusters) {
  // One chain of 4 bijectively tied nodes (one cluster of 3 labels) and a lone node of 2
  // labels joined to it by an edge that is a row term plus a column term: the model has a
  // column per feasible label of the two clusters and none for the pairs (the edge folds into
  // the label costs, the chain's edges into its cluster's).
  std::mt19937_64 rng(5);
  Problem p = clustered_problem(rng, 1, 4, 3);
  p.edges.resize(3);  // the chain's bijective edges only
  p.node_costs.push_back({1, 2});
  p.node_usages.push_back({1, 2});
  p.intervals.push_back({0, 3});
  p.edges.push_back(Edge{4, 0, {1, 2, 3, 4, 5, 6}});
  const detail::GraphView g = detail::build_graph_view(p);
  const detail::Clusters c = detail::find_clusters(g);
  ASSERT_EQ(c.num_clusters(), 2);
  int infeasible_labels = 0;  // a label of the chain with an infeasible member has no column
  for (int s = 0; s < 3; ++s) {
    bool bad = false;
    for (int32_t i = 0; i < 4; ++i) bad |= is_infeasible(g.costs(i)[c.label_of_root[c.map_offset[i] + s]]);
    infeasible_labels += bad;
  }
  const detail::MilpSize size = detail::milp_size(g, c, p.usage_limit);
  EXPECT_EQ(size.columns, 3 - infeasible_labels + 2);
  EXPECT_FALSE(size.lazy_memory);
  EXPECT_TRUE(detail::milp_size(g, c, p.usage_limit, 0).lazy_memory);
  EXPECT_FALSE(detail::milp_size(g, c, -1, 0).lazy_memory);  // no memory limit, no memory rows
}

TEST(Milp, StartsFromAGivenPlan) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const Problem p = random_problem(rng, 6, 4, trial % 2 == 0);
    const Brute b = brute_force(p);
    if (!b.feasible) continue;
    SolveOptions o;
    o.time_limit_s = 10;
    const SolveResult r = milp_of(p, p.usage_limit, true, o, &b.plan);
    expect_matches_brute_force(p, b, r, trial);
  }
}

TEST(Milp, WritesHighsLogToTheGivenFileOnly) {
  // --milp-log: HiGHS's own log goes to the file (appended by every run), the result is the
  // same as without it.
  std::mt19937_64 rng(11);
  Problem p = random_problem(rng, 6, 4, false);
  while (!brute_force(p).feasible) p = random_problem(rng, 6, 4, false);
  const Brute b = brute_force(p);
  const std::filesystem::path log = std::filesystem::temp_directory_path() / "autoshard_test_milp.log";
  std::filesystem::remove(log);
  SolveOptions o;
  o.time_limit_s = 10;
  o.milp_log = log.string();
  const SolveResult r = milp_of(p, p.usage_limit, true, o, nullptr);
  expect_matches_brute_force(p, b, r, 0);
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  EXPECT_NE(text.str().find("HiGHS"), std::string::npos) << text.str();
  std::filesystem::remove(log);
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
  const SolveResult m = milp_of(p, -1, true, o, nullptr);
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
  const SolveResult r = milp_of(p, p.usage_limit, true, o, nullptr, &proven_elsewhere);
  EXPECT_LT(seconds_since(t0), 5.0);
  if (r.found) EXPECT_TRUE(plan_valid(p, r.solution, nullptr));
}

}  // namespace
}  // namespace autoshard
