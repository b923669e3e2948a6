// The heuristic against brute force on random small problems: every plan it returns is valid,
// its cost is the optimum on (almost) all of them, and its lower bound never exceeds the optimum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <random>

#include "autoshard/heuristic.h"
#include "solver/heuristic/memory_profile.h"
#include "solver/heuristic/graph_clusters.h"
#include "solver/graph_view.h"
#include "solver/heuristic/lns_tree.h"
#include "solver/heuristic/local_search.h"
#include "test_heuristic_util.h"
#include "solver/heuristic/trws.h"

namespace autoshard {
namespace {

using namespace testing_util;

TEST(HeuristicRandom, ValidCloseToOptimumAndBoundBelowIt) {
  std::mt19937_64 rng(777);
  int feasible = 0, found = 0, optimal = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const Problem p = random_problem(rng, 4 + trial % 5, 4, trial % 3 == 0);
    const Brute truth = brute_force(p);
    SolveOptions o;
    o.time_limit_s = 0.05;
    const SolveResult r = solve_heuristic(p, o);
    if (r.found) {
      Cost c;
      ASSERT_TRUE(plan_valid(p, r.solution, &c)) << "trial " << trial << " returned an invalid plan";
      EXPECT_DOUBLE_EQ(c, r.cost) << "trial " << trial;
      ASSERT_TRUE(truth.feasible) << "trial " << trial;
      EXPECT_GE(r.cost, truth.best) << "trial " << trial;
    }
    if (!truth.feasible) continue;
    ++feasible;
    EXPECT_LE(r.lower_bound, truth.best + 1e-6) << "trial " << trial << ": bound above the optimum";
    if (r.proven_optimal) EXPECT_DOUBLE_EQ(r.cost, truth.best) << "trial " << trial;
    found += r.found;
    optimal += r.found && r.cost == truth.best;
  }
  std::printf("feasible %d found %d optimal %d\n", feasible, found, optimal);
  ASSERT_GT(feasible, 60);
  EXPECT_GE(found, feasible * 95 / 100) << "found " << found << " of " << feasible;
  EXPECT_GE(optimal, feasible * 85 / 100) << "optimal " << optimal << " of " << feasible;
}

TEST(HeuristicRandom, PortfolioPlansValidAndBoundBelowOptimum) {
  // The second portfolio run pushes the multipliers where decodes keep breaking the limit
  // (SearchConfig::push_after_over_rounds) and passes messages in reverse node order
  // (SearchConfig::reverse_sweeps): its plans must stay valid and its bound below the optimum.
  std::mt19937_64 rng(9090);
  int feasible = 0;
  for (int trial = 0; trial < 100; ++trial) {
    const Problem p = random_problem(rng, 6 + trial % 4, 5, false);
    const Brute truth = brute_force(p);
    SolveOptions o;
    o.time_limit_s = 0.05;
    o.threads = 2;
    const SolveResult r = solve_heuristic(p, o);
    if (r.found) {
      Cost c;
      ASSERT_TRUE(plan_valid(p, r.solution, &c)) << "trial " << trial << " returned an invalid plan";
      ASSERT_TRUE(truth.feasible) << "trial " << trial;
      EXPECT_GE(r.cost, truth.best) << "trial " << trial;
    }
    if (!truth.feasible) continue;
    ++feasible;
    EXPECT_LE(r.lower_bound, truth.best + 1e-6) << "trial " << trial << ": bound above the optimum";
  }
  ASSERT_GT(feasible, 30);
}

TEST(HeuristicRandom, GroupsTiedByBijectiveEdges) {
  // XLA-style "follow" edges: a permutation of finite entries, everything else infeasible.
  // The groups they form must be decoded and moved together; results still match brute force.
  std::mt19937_64 rng(4242);
  int feasible = 0, optimal = 0;
  for (int trial = 0; trial < 80; ++trial) {
    Problem p = random_problem(rng, 5 + trial % 3, 3, false);
    for (auto& row : p.node_costs)
      for (auto& c : row)
        if (is_infeasible(c)) c = 40;
    for (int k = 0; k < 3; ++k) {
      const int u = int(rng() % p.num_nodes()), v = int(rng() % p.num_nodes());
      const size_t S = p.node_costs[u].size();
      if (u == v || p.node_costs[v].size() != S) continue;
      std::vector<int> perm(S);
      for (size_t s = 0; s < S; ++s) perm[s] = int(s);
      std::shuffle(perm.begin(), perm.end(), rng);
      Edge e{u, v, std::vector<Cost>(S * S, kInfeasibleCost)};
      for (size_t s = 0; s < S; ++s) e.costs[s * S + perm[s]] = Cost(rng() % 5);
      p.edges.push_back(e);
    }
    const Brute truth = brute_force(p);
    SolveOptions o;
    o.time_limit_s = 0.05;
    const SolveResult r = solve_heuristic(p, o);
    if (r.found) {
      Cost c;
      ASSERT_TRUE(plan_valid(p, r.solution, &c)) << "trial " << trial;
      EXPECT_DOUBLE_EQ(c, r.cost);
    }
    if (!truth.feasible) continue;
    ++feasible;
    EXPECT_LE(r.lower_bound, truth.best + 1e-6) << "trial " << trial;
    optimal += r.found && r.cost == truth.best;
  }
  ASSERT_GT(feasible, 30);
  EXPECT_GE(optimal, feasible * 85 / 100) << "optimal " << optimal << " of " << feasible;
}

TEST(HeuristicRandom, FindsBijectiveGroups) {
  // 0 -(perm)- 1 -(perm)- 2, and 2 - 3 by an ordinary edge: groups {0,1,2} and {3}.
  Problem p;
  p.node_costs = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  const Cost X = kInfeasibleCost;
  p.edges = {{0, 1, {X, 1, 2, X}}, {2, 1, {3, X, X, 4}}, {2, 3, {1, 2, 3, 4}}};
  const detail::GraphView g = detail::build_graph_view(p);
  const detail::Clusters c = detail::find_clusters(g);
  EXPECT_EQ(c.num_clusters(), 2);
  EXPECT_EQ(c.cluster_of[0], c.cluster_of[2]);
  EXPECT_NE(c.cluster_of[0], c.cluster_of[3]);
  // Root 0 at label 0 forces node 1 to label 1, which forces node 2 to label 1.
  EXPECT_EQ(c.label_of_root[c.map_offset[1] + 0], 1);
  EXPECT_EQ(c.label_of_root[c.map_offset[2] + 0], 1);
  EXPECT_EQ(c.label_of_root[c.map_offset[2] + 1], 0);
}

TEST(HeuristicRandom, SharedEdgeMatricesViewLikeCopies) {
  // Every edge of a random problem handed over as shared storage (build_graph_view's
  // `shared`): the view references the lone ones in (u < v) order, copies the rest (reversed
  // and parallel edges), and prices every plan as the view built from copies does.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    Problem p = random_problem(rng, 6, 4, false);
    p.edges.push_back(p.edges.empty() ? Edge{0, 1, std::vector<Cost>(p.num_strategies(0) * p.num_strategies(1), 1.0)}
                                      : p.edges[0]);  // a parallel edge
    const detail::GraphView copied = detail::build_graph_view(p);
    std::vector<std::vector<Cost>> storage;
    for (const Edge& e : p.edges) storage.push_back(e.costs);
    std::vector<const Cost*> shared;
    for (const auto& m : storage) shared.push_back(m.data());
    const detail::GraphView view = detail::build_graph_view(p, &shared);
    ASSERT_EQ(view.num_edges(), copied.num_edges());
    for (int k = 0; k < 20; ++k) {
      std::vector<int32_t> x(p.num_nodes());
      for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t(rng() % p.num_strategies(i));
      EXPECT_EQ(detail::graph_cost(view, x), detail::graph_cost(copied, x));
    }
  }
}

TEST(HeuristicRandom, IdenticalEdgeMatricesShareOneCopy) {
  // A chain whose edges repeat two tables (a model's repeated layers), one of them also in a
  // transposed shape: edges with equal shape and entries point at one copy, the others keep
  // their own, and every plan is priced as from the input.
  const std::vector<Cost> first = {0, 1, 2, 3, 4, 5}, second = {0, 1, 2, 3, 4, 6};
  Problem p;
  for (int i = 0; i < 6; ++i) p.node_costs.push_back(i % 2 == 0 ? std::vector<Cost>{1, 2} : std::vector<Cost>{3, 4, 5});
  p.edges.push_back({0, 1, first});   // 2 x 3
  p.edges.push_back({2, 3, first});   // the same table
  p.edges.push_back({4, 5, second});  // one entry differs
  p.edges.push_back({1, 2, first});   // 3 x 2: same bytes, other shape
  p.edges.push_back({3, 4, first});   // the 3 x 2 table again
  const detail::GraphView g = detail::build_graph_view(p);
  ASSERT_EQ(g.num_edges(), 5);
  EXPECT_EQ(g.edge_matrix(0), g.edge_matrix(1));
  EXPECT_NE(g.edge_matrix(0), g.edge_matrix(2));
  EXPECT_NE(g.edge_matrix(0), g.edge_matrix(3));
  EXPECT_EQ(g.edge_matrix(3), g.edge_matrix(4));
  std::mt19937_64 rng(5);
  for (int k = 0; k < 50; ++k) {
    std::vector<int32_t> x(p.num_nodes());
    for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t(rng() % p.num_strategies(i));
    Cost expected = 0;
    for (size_t i = 0; i < x.size(); ++i) expected += p.node_costs[i][x[i]];
    for (const Edge& e : p.edges) expected += e.costs[size_t(x[e.u]) * p.num_strategies(e.v) + x[e.v]];
    EXPECT_EQ(detail::graph_cost(g, x), expected);
  }
}

TEST(HeuristicRandom, TreeLnsSolvesATreeExactly) {
  // On a tree, the grown neighbourhood is the whole tree, so one DP step reaches the optimum.
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 30; ++trial) {
    Problem p = random_problem(rng, 5 + trial % 4, 4, false);
    p.usage_limit = -1;
    p.edges.resize(p.num_nodes() - 1);
    for (auto& e : p.edges)
      for (auto& c : e.costs)
        if (is_infeasible(c)) c = 50;
    for (auto& row : p.node_costs)
      for (auto& c : row)
        if (is_infeasible(c)) c = 50;
    const Brute truth = brute_force(p);
    const detail::GraphView g = detail::build_graph_view(p);
    const detail::Clusters cl = detail::find_clusters(g);
    detail::MemoryProfile mem(g, -1);
    detail::PlanState state(g, mem);
    state.reset(std::vector<int32_t>(p.num_nodes(), 0));
    detail::TreeLns lns(g, cl);
    lns.set_prices(std::vector<Cost>(g.node_cost.size(), 0.0));
    std::mt19937_64 seed_rng(1);
    lns.run(state, detail::Clock::now() + std::chrono::seconds(5), 3, 1000, seed_rng);
    EXPECT_DOUBLE_EQ(detail::graph_cost(g, state.labels()), truth.best) << "trial " << trial;
  }
}

TEST(HeuristicRandom, GroupRepairReturnsValidPlans) {
  std::mt19937_64 rng(77);
  int feasible = 0, repaired = 0;
  for (int trial = 0; trial < 100; ++trial) {
    Problem p = random_problem(rng, 6, 4, false);
    for (auto& e : p.edges)
      for (auto& c : e.costs)
        if (is_infeasible(c)) c = 50;
    for (auto& row : p.node_costs)
      for (auto& c : row)
        if (is_infeasible(c)) c = 50;
    if (p.usage_limit < 0) continue;
    const Brute truth = brute_force(p);
    if (!truth.feasible) continue;
    ++feasible;
    const detail::GraphView g = detail::build_graph_view(p);
    const detail::Clusters cl = detail::find_clusters(g);
    detail::MemoryProfile mem(g, p.usage_limit);
    detail::PlanState state(g, mem);
    // Start from the largest-usage plan: the repair has to shrink it.
    std::vector<int32_t> x(p.num_nodes(), 0);
    for (size_t i = 0; i < p.num_nodes(); ++i)
      for (size_t s = 0; s < p.node_costs[i].size(); ++s)
        if (g.usages(int32_t(i))[s] > g.usages(int32_t(i))[x[i]]) x[i] = int32_t(s);
    state.reset(x);
    detail::TreeLns lns(g, cl);
    if (!lns.repair(state, detail::Clock::now() + std::chrono::seconds(5))) continue;
    ++repaired;
    Cost c;
    ASSERT_TRUE(plan_valid(p, state.labels(), &c)) << "trial " << trial;
    EXPECT_DOUBLE_EQ(c, state.cost()) << "trial " << trial;
  }
  ASSERT_GT(feasible, 30);
  EXPECT_GE(repaired, feasible * 9 / 10);
}

TEST(HeuristicRandom, GroupRepairGivesUpWhereItsMovesCycle) {
  // Two groups of two nodes tied by identity edges, one member of each live at time 0 and the
  // other at time 1. Label 0 puts a group's usage at time 0, label 1 at time 1, so no plan fits
  // the limit of 9 (15 in all at one time or 10 + 5 split): moving the first group off the
  // peak at time 0 makes time 1 the peak, whose best move takes it back. The repair must give
  // up, not move to and fro until its deadline.
  Problem p;
  p.node_costs = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
  p.node_usages = {{10, 0}, {0, 10}, {5, 0}, {0, 5}};
  p.intervals = {{0, 1}, {1, 2}, {0, 1}, {1, 2}};
  p.edges = {Edge{0, 1, {0, kInfeasibleCost, kInfeasibleCost, 0}},
             Edge{2, 3, {0, kInfeasibleCost, kInfeasibleCost, 0}}};
  p.usage_limit = 9;
  const detail::GraphView g = detail::build_graph_view(p);
  const detail::Clusters cl = detail::find_clusters(g);
  ASSERT_EQ(cl.num_clusters(), 2);
  detail::MemoryProfile mem(g, p.usage_limit);
  detail::PlanState state(g, mem);
  state.reset({0, 0, 0, 0});
  detail::TreeLns lns(g, cl);
  const auto deadline = detail::Clock::now() + std::chrono::seconds(60);
  EXPECT_FALSE(lns.repair(state, deadline));
  EXPECT_LT(detail::Clock::now(), deadline);
}

TEST(HeuristicRandom, TrwsBoundIsExactOnTrees) {
  // Without memory and on a tree, the forward-push bound of converged TRW-S is the optimum.
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    Problem p = random_problem(rng, 5 + trial % 4, 4, false);
    p.usage_limit = -1;
    p.edges.resize(p.num_nodes() - 1);  // the random spanning tree only
    for (auto& e : p.edges)
      for (auto& c : e.costs)
        if (is_infeasible(c)) c = 50;
    for (auto& row : p.node_costs)
      for (auto& c : row)
        if (is_infeasible(c)) c = 50;
    const Brute truth = brute_force(p);
    ASSERT_TRUE(truth.feasible);
    const detail::GraphView g = detail::build_graph_view(p);
    for (const bool reversed : {false, true}) {
      detail::Trws trws(g, reversed);
      std::vector<int32_t> x;
      for (int k = 0; k < 30; ++k) trws.iterate(x);
      EXPECT_NEAR(trws.lower_bound(), truth.best, 1e-6) << "trial " << trial << " reversed " << reversed;
      EXPECT_DOUBLE_EQ(detail::graph_cost(g, x), truth.best) << "trial " << trial << " reversed " << reversed;
    }
  }
}

TEST(HeuristicRandom, MemoryProfileMatchesNaiveSums) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    const Problem p = random_problem(rng, 8, 4, false);
    const detail::GraphView g = detail::build_graph_view(p);
    detail::MemoryProfile mem(g, 1000);
    std::vector<int32_t> x(p.num_nodes(), 0);
    mem.reset(x);
    for (int step = 0; step < 20; ++step) {
      const int i = int(rng() % p.num_nodes());
      const int s = int(rng() % p.node_costs[i].size());
      mem.move(i, x[i], s);
      x[i] = s;
      int64_t naive = 0;
      for (int64_t t = 0; t < 12; ++t) {
        int64_t live = 0;
        for (size_t j = 0; j < p.num_nodes(); ++j)
          if (p.intervals[j].start <= t && t < p.intervals[j].end && !p.node_usages[j].empty())
            live += p.node_usages[j][x[j]];
        naive = std::max(naive, live);
      }
      ASSERT_EQ(mem.num_points() ? mem.peak() : 0, naive) << "trial " << trial << " step " << step;
    }
  }
}

TEST(HeuristicRandom, ReportsInfeasibleProblems) {
  Problem p;
  p.node_costs = {{0, 0}, {0}};
  p.node_usages = {{6, 7}, {5}};
  p.intervals = {{0, 2}, {1, 3}};
  p.usage_limit = 10;
  const SolveResult r = solve_heuristic(p, SolveOptions{});
  EXPECT_FALSE(r.found);
  EXPECT_NE(r.status.find("infeasible"), std::string::npos);
}

}  // namespace
}  // namespace autoshard
