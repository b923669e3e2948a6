// The budget branch and bound (solver/budget_branch.h), the budget reductions and the gap
// tolerance, against brute force on knapsack-like problems: no memory limit, one global
// budget whose cheap choices use more of it (a parameter-memory budget with headroom).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>

#include "autoshard/exact.h"
#include "autoshard/planner.h"
#include "autoshard/problem_io.h"
#include "autoshard/reduce.h"
#include "autoshard/solver.h"
#include "solver/exact/budget_branch.h"
#include "solver/graph_view.h"
#include "solver/heuristic/trws.h"
#include "test_cli_run.h"
#include "test_data_paths.h"
#include "test_heuristic_util.h"
#include "io/json.h"
#include "io/options_json.h"

namespace autoshard {
namespace {

using namespace testing_util;

// n nodes on a random tree plus a few extra edges; about half carry the budget, and their
// labels that use more of it cost less. `slack` places high between the smallest and the
// largest possible sum (0: at the smallest).
Problem knapsack_problem(std::mt19937_64& rng, int n, int max_labels, double slack, bool with_low = false) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  p.node_costs.resize(n);
  GlobalBudget b;
  b.name = "parameter memory";
  b.usage.resize(n);
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < n; ++i) {
    const int S = uni(2, max_labels);
    const bool carries = uni(0, 1) == 1;
    int64_t mn = INT64_MAX, mx = 0;
    for (int s = 0; s < S; ++s) {
      const int64_t u = carries ? 16 * uni(1, 8) : 0;
      p.node_costs[i].push_back(Cost(uni(0, 20) + (carries ? 60 - int(u / 4) : uni(0, 40))));
      if (carries) b.usage[i].push_back(u);
      mn = std::min(mn, u);
      mx = std::max(mx, u);
    }
    lo += mn;
    hi += mx;
  }
  auto add_edge = [&](int u, int v) {
    Edge e{u, v, {}};
    for (size_t k = 0; k < p.node_costs[u].size() * p.node_costs[v].size(); ++k) e.costs.push_back(Cost(uni(0, 25)));
    p.edges.push_back(std::move(e));
  };
  for (int i = 1; i < n; ++i) add_edge(uni(0, i - 1), i);
  for (int k = uni(0, n / 3); k > 0; --k) {
    const int u = uni(0, n - 1), v = uni(0, n - 1);
    if (u != v) add_edge(u, v);
  }
  b.high = lo + static_cast<int64_t>(slack * double(hi - lo));
  b.low = with_low ? lo + (b.high - lo) / 2 : 0;
  p.budgets.push_back(std::move(b));
  return p;
}

TEST(BudgetBranch, ProvesTheOptimumWithoutAWarmStart) {
  std::mt19937_64 rng(2024);
  int proven = 0, feasible = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Problem p = knapsack_problem(rng, 8 + trial % 6, 3, 0.15 + 0.1 * (trial % 6), trial % 4 == 3);
    const Brute truth = brute_force(p);
    SolveOptions o;
    o.time_limit_s = 10;
    SolveResult r;
    if (!detail::solve_budget_branch(p, o, nullptr, r)) continue;  // reductions left no binding budget
    if (!truth.feasible) {
      EXPECT_FALSE(r.found) << "trial " << trial;
      continue;
    }
    ++feasible;
    EXPECT_LE(r.lower_bound, truth.best + 1e-6) << "trial " << trial << ": bound above the optimum";
    if (r.found) {
      Cost c;
      ASSERT_TRUE(plan_valid(p, r.solution, &c)) << "trial " << trial;
      EXPECT_DOUBLE_EQ(c, r.cost) << "trial " << trial;
    }
    if (r.proven_optimal) {
      ++proven;
      ASSERT_TRUE(r.found) << "trial " << trial;  // no warm start: the plan is its own
      EXPECT_DOUBLE_EQ(r.cost, truth.best) << "trial " << trial;
      EXPECT_EQ(r.status, "optimal");
    }
  }
  std::printf("feasible %d proven %d\n", feasible, proven);
  EXPECT_GT(feasible, 20);
  EXPECT_GE(proven, feasible * 9 / 10);
}

TEST(BudgetBranch, DispatcherClosesLargerProblemsAndHonoursTheGapTolerance) {
  // 21+ nodes with 2-3 labels: over a million plans, so solve() takes the heuristic path and
  // the branching closes what the heuristic's Lagrangian bound leaves open.
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 4; ++trial) {
    const Problem p = knapsack_problem(rng, 21, 2, 0.3 + 0.1 * trial);
    const Brute truth = brute_force(p);
    ASSERT_TRUE(truth.feasible) << "trial " << trial;
    SolveOptions o;
    o.time_limit_s = 20;
    const SolveResult exact = solve(p, o);
    ASSERT_TRUE(exact.found) << exact.status;
    EXPECT_TRUE(exact.proven_optimal) << "trial " << trial << ": " << exact.status;
    EXPECT_DOUBLE_EQ(exact.cost, truth.best) << "trial " << trial;
    EXPECT_LT(exact.total_time_s, 5.0);

    o.gap_tolerance = 0.05;
    const SolveResult loose = solve(p, o);
    ASSERT_TRUE(loose.found);
    EXPECT_TRUE(loose.status == "optimal" || loose.status == "gap tolerance") << loose.status;
    EXPECT_LE(loose.lower_bound, truth.best + 1e-6);
    EXPECT_GE(loose.cost, truth.best);
    EXPECT_LE(loose.cost - loose.lower_bound, 0.05 * loose.cost + 1e-9);
  }
}

TEST(BudgetBranch, WorkLimitedRunsAreIdentical) {
  std::mt19937_64 rng(7);
  const Problem p = knapsack_problem(rng, 24, 3, 0.35);
  SolveOptions o;
  o.time_limit_s = 60;
  o.work_limit = 3'000'000;
  const SolveResult a = solve(p, o), b = solve(p, o);
  ASSERT_TRUE(a.found);
  EXPECT_EQ(a.solution, b.solution);
  EXPECT_EQ(a.cost, b.cost);
  EXPECT_EQ(a.lower_bound, b.lower_bound);
  EXPECT_EQ(a.work, b.work);
  EXPECT_EQ(a.status, b.status);
}

TEST(BudgetBranch, ExactSearchStopsAtTheGapTolerance) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 20; ++trial) {
    const Problem p = knapsack_problem(rng, 9, 3, 0.4);
    const Brute truth = brute_force(p);
    if (!truth.feasible) continue;
    SolveOptions o;
    o.time_limit_s = 10;
    o.gap_tolerance = 0.1;
    const SolveResult r = solve_exact(p, o);
    ASSERT_TRUE(r.found) << "trial " << trial;
    EXPECT_GE(r.cost, truth.best);
    EXPECT_LE(r.lower_bound, truth.best + 1e-6) << "trial " << trial;
    EXPECT_LE(r.cost - r.lower_bound, 0.1 * r.cost + 1e-9) << "trial " << trial;
    if (r.proven_optimal) EXPECT_DOUBLE_EQ(r.cost, truth.best);
  }
}

TEST(BudgetReduce, BudgetAtItsMinimumPinsEveryCarrier) {
  std::mt19937_64 rng(5);
  const Problem p = knapsack_problem(rng, 12, 3, 0.0);  // high = the smallest possible sum
  const Reduction r = reduce(p);
  ASSERT_FALSE(r.infeasible) << r.infeasible_reason;
  EXPECT_GT(r.stats.budget_removed, 0);
  // What is left never varies in the budget: no budget can bind in the reduced problem.
  for (size_t i = 0; i < r.reduced.num_nodes(); ++i) {
    const auto& row = r.reduced.budgets[0].usage[i];
    if (row.empty()) continue;
    EXPECT_EQ(*std::min_element(row.begin(), row.end()), *std::max_element(row.begin(), row.end())) << i;
  }
  const Brute before = brute_force(p), after = brute_force(r.reduced);
  ASSERT_TRUE(before.feasible && after.feasible);
  EXPECT_DOUBLE_EQ(before.best, after.best + r.cost_offset);
  Cost c;
  EXPECT_TRUE(plan_valid(p, r.expand(after.plan), &c));
  EXPECT_DOUBLE_EQ(c, before.best);
}

TEST(BudgetReduce, ImpossibleBudgetIsProvenInfeasible) {
  Problem p;
  p.node_costs = {{1, 2}, {3, 4}};
  p.edges.push_back({0, 1, {0, 0, 0, 0}});
  GlobalBudget b;
  b.usage = {{5, 6}, {7, 9}};
  b.high = 11;  // at least 5 + 7 = 12
  p.budgets.push_back(b);
  const Reduction r = reduce(p);
  EXPECT_TRUE(r.infeasible);
  EXPECT_NE(r.infeasible_reason.find("cannot be met"), std::string::npos) << r.infeasible_reason;
}

TEST(BudgetReduce, ConstantUsageLeavesWithItsNode) {
  // Node 1 always uses 4 of the budget and carries no memory: it is folded into node 0, and
  // the budget's bounds drop by 4 so that node 0's choice is limited the same way.
  Problem p;
  p.node_costs = {{0, 10}, {1, 1}};
  p.edges.push_back({0, 1, {5, 0, 0, 5}});
  GlobalBudget b;
  b.usage = {{6, 2}, {4, 4}};
  b.low = 5;
  b.high = 10;
  p.budgets.push_back(b);
  const Reduction r = reduce(p);
  ASSERT_FALSE(r.infeasible) << r.infeasible_reason;
  ASSERT_EQ(r.reduced.num_nodes(), 1u);
  EXPECT_EQ(r.reduced.budgets[0].high, 6);
  EXPECT_EQ(r.reduced.budgets[0].low, 1);
  const Brute before = brute_force(p), after = brute_force(r.reduced);
  ASSERT_TRUE(before.feasible && after.feasible);
  EXPECT_DOUBLE_EQ(before.best, after.best + r.cost_offset);
}

TEST(BudgetBranch, HeldOutTrwsBoundIsValidForEveryPlan) {
  // lower_bound_keeping: every labeling's energy >= the returned value + the held-out nodes'
  // terms at their labels, whatever the messages (after 0, 1 or several sweeps).
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    Problem p = knapsack_problem(rng, 7, 3, 0.5);
    p.budgets.clear();  // energies of every plan, within the budget or not
    const detail::GraphView g = detail::build_graph_view(p);
    detail::Trws trws(g);
    std::vector<uint8_t> keep(g.num_nodes, 0);
    for (int32_t i = 0; i < g.num_nodes; ++i) keep[i] = (i + trial) % 3 == 0;
    std::vector<int32_t> labeling, kept;
    std::vector<Cost> terms;
    for (int sweeps = 0; sweeps < 3; ++sweeps) {
      const Cost rest = trws.lower_bound_keeping(keep, terms, kept);
      EXPECT_LE(
          trws.lower_bound(), rest + 1e-9 + [&] {
            Cost sum = 0;  // each held-out term minimised alone gives lower_bound() back
            for (int32_t i : kept)
              sum +=
                  *std::min_element(terms.begin() + g.label_offset[i], terms.begin() + g.label_offset[i] + g.labels(i));
            return sum;
          }());
      Solution x(p.num_nodes(), 0);
      while (true) {
        Cost energy;
        ASSERT_TRUE(plan_valid(p, x, &energy));
        Cost bound = rest;
        for (int32_t i : kept) bound += terms[g.label_offset[i] + x[i]];
        ASSERT_LE(bound, energy + 1e-6) << "trial " << trial << " sweeps " << sweeps;
        size_t k = 0;
        while (k < x.size() && ++x[k] == int32_t(p.node_costs[k].size())) x[k++] = 0;
        if (k == x.size()) break;
      }
      trws.iterate(labeling);
    }
  }
}

TEST(GapTolerance, IsCheckedWhereItEnters) {
  EXPECT_EQ(checked_gap_tolerance(0.0, "x"), 0.0);
  EXPECT_EQ(checked_gap_tolerance(0.001, "x"), 0.001);
  for (double bad : {-0.1, 1.0, 2.0, std::numeric_limits<double>::quiet_NaN()})
    EXPECT_THROW(checked_gap_tolerance(bad, "gap"), std::invalid_argument) << bad;
  Problem p;
  p.node_costs = {{1}};
  SolveOptions o;
  o.gap_tolerance = -1;
  EXPECT_THROW(solve(p, o), std::invalid_argument);
}

TEST(GapTolerance, PlannerOptionsAndCommandLine) {
  const Json base = parse_json(R"({"mesh": {"shape": [2]}})");
  EXPECT_EQ(parse_planner_options(base).gap_tolerance, kDefaultGapTolerance);
  EXPECT_EQ(parse_planner_options(parse_json(R"({"mesh": {"shape": [2]}, "gap_tolerance": 0})")).gap_tolerance, 0.0);
  EXPECT_EQ(parse_planner_options(parse_json(R"({"mesh": {"shape": [2]}, "gap_tolerance": 0.02})")).gap_tolerance,
            0.02);
  for (const char* bad : {"-0.5", "1", "3"}) {
    try {
      parse_planner_options(parse_json(std::string(R"({"mesh": {"shape": [2]}, "gap_tolerance": )") + bad + "}"));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const JsonError& e) {
      EXPECT_NE(std::string(e.what()).find("options.gap_tolerance must be a fraction in [0, 1)"), std::string::npos)
          << e.what();
    }
  }
  const std::string graph = test_data("mlp2_fwd_bwd.json");
  CliRun r = run_cli({"plan", graph, "--mesh", "4", "--gap-tolerance", "1.5"});
  EXPECT_EQ(r.rc, 1) << r.out << r.err;  // as for --time-limit 0
  EXPECT_NE(r.err.find("--gap-tolerance must be a fraction"), std::string::npos) << r.err;
  r = run_cli({"solve", "x.json", "--gap-tolerance", "abc"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--gap-tolerance expects a fraction"), std::string::npos) << r.err;
  r = run_cli({"solve", "x.json", "--gap-tolerance", "-1"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--gap-tolerance must be a fraction"), std::string::npos) << r.err;
}

TEST(GapTolerance, PlanWritesItsProblemForTheSolver) {
  // `autoshard plan --problem-out` writes the solver problem the plan came from (budgets
  // included); `autoshard solve` finds a plan of the same cost on it.
  const std::string problem = ::testing::TempDir() + "autoshard_plan_problem.json";
  CliRun r = run_cli({"plan", test_data("mlp2_fwd_bwd.json"), "--mesh", "4", "--param-memory", "0,0.5", "--time-limit",
                      "5", "--gap-tolerance", "0", "--problem-out", problem});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("solver problem written to"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimal"), std::string::npos) << r.out;
  const Problem p = read_problem(problem);
  ASSERT_EQ(p.budgets.size(), 1u);
  CliRun s = run_cli({"solve", problem, "--time-limit", "5"});
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_NE(s.out.find("proven optimal"), std::string::npos) << s.out;
  std::remove(problem.c_str());
}

}  // namespace
}  // namespace autoshard
