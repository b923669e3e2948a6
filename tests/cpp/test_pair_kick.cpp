// PairKick (heuristic/pair_kick.h): on a triangle where no single-node, group or tree move
// improves the plan, kicking two nodes and letting the third settle reaches the brute-force
// optimum; on random problems a kick never returns an invalid or a costlier plan.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "solver/graph_view.h"
#include "solver/heuristic/graph_clusters.h"
#include "solver/heuristic/lns_tree.h"
#include "solver/heuristic/local_search.h"
#include "solver/heuristic/memory_profile.h"
#include "solver/heuristic/pair_kick.h"
#include "test_heuristic_util.h"

namespace autoshard {
namespace {

using namespace testing_util;

// Three nodes, pairwise joined by "agree" edges (0 when equal, 10 otherwise: finite, so no
// bijective groups form). Label 0 costs 1 and uses 2 units; label 1 costs 0 and uses 1. All
// three are live together and the limit is exactly the all-0 plan's peak.
Problem triangle() {
  Problem p;
  p.node_costs.assign(3, {1.0, 0.0});
  p.node_usages.assign(3, {2, 1});
  p.intervals.assign(3, {0, 1});
  p.usage_limit = 6;
  for (auto [u, v] : {std::pair{0, 1}, std::pair{0, 2}, std::pair{1, 2}}) {
    Edge e;
    e.u = u;
    e.v = v;
    e.costs = {0.0, 10.0, 10.0, 0.0};
    p.edges.push_back(e);
  }
  return p;
}

TEST(PairKick, OnlyThePairMoveLeavesTheTriangleLocalOptimum) {
  const Problem p = triangle();
  const Brute truth = brute_force(p);
  ASSERT_TRUE(truth.feasible);
  ASSERT_DOUBLE_EQ(truth.best, 0.0);

  const detail::GraphView g = detail::build_graph_view(p);
  const detail::Clusters cl = detail::find_clusters(g);
  ASSERT_EQ(cl.num_clusters(), 3);  // no bijective edges: every node is its own group
  detail::MemoryProfile mem(g, p.usage_limit);
  detail::PlanState state(g, mem);
  const auto deadline = detail::Clock::now() + std::chrono::seconds(5);
  state.reset({0, 0, 0});
  ASSERT_TRUE(state.valid());
  ASSERT_DOUBLE_EQ(state.cost(), 3.0);

  // All-0 is a local optimum of every other move: one node alone pays 20 on its edges for 1,
  // and any induced tree of a triangle holds two nodes, which pay 20 with the third fixed.
  EXPECT_EQ(state.descend(deadline), 0);
  EXPECT_EQ(state.descend_clusters(deadline, cl), 0);
  EXPECT_EQ(state.descend_ejection(deadline, cl), 0);
  detail::TreeLns lns(g, cl);
  lns.set_prices(std::vector<Cost>(g.node_cost.size(), 0.0));
  std::mt19937_64 rng(3);
  EXPECT_EQ(lns.run(state, deadline, 200, 48, rng), 0);
  EXPECT_DOUBLE_EQ(state.cost(), 3.0);

  detail::PairKick kick(g, cl, lns.groups());
  EXPECT_EQ(kick.run(state, deadline, 100), 1);
  Cost c;
  ASSERT_TRUE(plan_valid(p, state.labels(), &c));
  EXPECT_DOUBLE_EQ(c, truth.best);
  EXPECT_DOUBLE_EQ(state.cost(), truth.best);
  EXPECT_EQ(state.labels(), (std::vector<int32_t>{1, 1, 1}));
}

TEST(PairKick, NeverReturnsAnInvalidOrCostlierPlan) {
  std::mt19937_64 rng(2024);
  int improved = 0, tried = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const Problem p = random_problem(rng, 5 + trial % 5, 4, trial % 3 == 0);
    const Brute truth = brute_force(p);
    if (!truth.feasible) continue;
    const detail::GraphView g = detail::build_graph_view(p);
    const detail::Clusters cl = detail::find_clusters(g);
    detail::MemoryProfile mem(g, p.usage_limit);
    detail::PlanState state(g, mem);
    const auto deadline = detail::Clock::now() + std::chrono::seconds(5);
    // Start from a valid plan: the optimum with one node moved where that stays valid.
    std::vector<int32_t> x = truth.plan;
    for (size_t i = 0; i < x.size(); ++i) {
      for (size_t s = 0; s < p.node_costs[i].size(); ++s) {
        std::vector<int32_t> y = x;
        y[i] = int32_t(s);
        if (y != x && plan_valid(p, y, nullptr)) {
          x = y;
          break;
        }
      }
      if (x != truth.plan) break;
    }
    state.reset(x);
    ASSERT_TRUE(state.valid()) << "trial " << trial;
    ++tried;
    const Cost before = state.cost();
    detail::TreeLns lns(g, cl);
    detail::PairKick kick(g, cl, lns.groups());
    improved += kick.run(state, deadline, 1000) > 0;
    Cost c;
    ASSERT_TRUE(plan_valid(p, state.labels(), &c)) << "trial " << trial;
    EXPECT_DOUBLE_EQ(c, state.cost()) << "trial " << trial;
    EXPECT_LE(c, before) << "trial " << trial;
    EXPECT_GE(c, truth.best) << "trial " << trial;
  }
  EXPECT_GT(tried, 100);
  EXPECT_GT(improved, 0);
}

}  // namespace
}  // namespace autoshard
