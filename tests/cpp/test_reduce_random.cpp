// Reductions must preserve the optimum exactly: brute force before and after, on random
// small problems with infeasible entries, tight memory limits, memory-free nodes and budgets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <random>

#include "autoshard/problem.h"
#include "autoshard/reduce.h"
#include "test_heuristic_util.h"

namespace autoshard {
namespace {

using namespace testing_util;

TEST(ReduceRandom, PreservesOptimumExactly) {
  std::mt19937_64 rng(12345);
  int feasible = 0, shrunk = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Problem p = random_problem(rng, 3 + trial % 6, 4, trial % 2 == 1);
    const Brute before = brute_force(p);
    const Reduction r = reduce(p);
    if (r.infeasible) {
      EXPECT_FALSE(before.feasible) << "trial " << trial << ": reduce claims infeasible: " << r.infeasible_reason;
      continue;
    }
    if (r.stats.strategies_after < r.stats.strategies_before || r.reduced.num_nodes() < p.num_nodes()) ++shrunk;
    const Brute after = brute_force(r.reduced);
    ASSERT_EQ(before.feasible, after.feasible) << "trial " << trial;
    if (!before.feasible) continue;
    ++feasible;
    EXPECT_DOUBLE_EQ(before.best, after.best + r.cost_offset) << "trial " << trial;
    // The reduced optimum maps back to a valid original plan with the same cost.
    const Solution x = r.expand(after.plan);
    Cost c;
    ASSERT_TRUE(plan_valid(p, x, &c)) << "trial " << trial;
    EXPECT_DOUBLE_EQ(c, before.best) << "trial " << trial;
  }
  std::printf("feasible %d shrunk %d\n", feasible, shrunk);
  EXPECT_GT(feasible, 100);  // the generator must exercise the interesting case
  EXPECT_GT(shrunk, 100);    // and the reductions must actually fire
}

TEST(ReduceRandom, EliminatesMemoryFreeChainAndLeaf) {
  // 0 - 1 - 2 - 3: nodes 1 and 3 never live -> both folded; the optimum is hand-computed.
  Problem p;
  p.node_costs = {{0, 5}, {1, 1}, {0, 0}, {3, 0}};
  p.node_usages = {{1, 1}, {}, {2, 2}, {}};
  p.intervals = {{0, 2}, {0, 0}, {1, 3}, {0, 0}};
  p.usage_limit = 10;
  auto eye = [](Cost off) { return std::vector<Cost>{0, off, off, 0}; };
  p.edges = {{0, 1, eye(4)}, {1, 2, eye(4)}, {2, 3, eye(7)}};
  const Reduction r = reduce(p);
  ASSERT_FALSE(r.infeasible);
  EXPECT_EQ(r.stats.nodes_eliminated, 2);
  EXPECT_EQ(r.reduced.num_nodes(), 2u);
  const Brute after = brute_force(r.reduced);
  ASSERT_TRUE(after.feasible);
  // Best: x = (0, 0, 0, 0) costs 0+1+0+3 = 4; (0,0,0,1) costs 1 + 7 = 8; (0,?,1,1): 0+1+4+0 = 5.
  EXPECT_DOUBLE_EQ(after.best + r.cost_offset, 4.0);
  EXPECT_EQ(r.expand(after.plan), (Solution{0, 0, 0, 0}));
}

TEST(ReduceRandom, DetectsMemoryInfeasibility) {
  Problem p;
  p.node_costs = {{0, 0}, {0}};
  p.node_usages = {{6, 7}, {5}};
  p.intervals = {{0, 2}, {1, 3}};
  p.usage_limit = 10;
  const Reduction r = reduce(p);
  EXPECT_TRUE(r.infeasible);
  EXPECT_NE(r.infeasible_reason.find("memory limit"), std::string::npos);
}

}  // namespace
}  // namespace autoshard
