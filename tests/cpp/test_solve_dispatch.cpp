// The dispatcher: valid plans, honest bounds (checked against the proven optimum of IOPDDL
// instance B), infeasible problems reported as such, malformed problems rejected.
#include <gtest/gtest.h>

#include "test_data_paths.h"

#include "autoshard/evaluate.h"
#include "autoshard/problem_io.h"
#include "autoshard/solver.h"

using namespace autoshard;

TEST(SolveDispatch, InstanceBValidPlanAndBoundAroundTheKnownOptimum) {
  AUTOSHARD_REQUIRE_INSTANCE(path_b, "B.json.gz");
  Problem p = read_problem(path_b);
  // One thread: the greedy safety net first, then the heuristic; two: the greedy beside it.
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    SolveOptions o;
    o.time_limit_s = 20;
    o.threads = threads;
    SolveResult r = solve(p, o);
    ASSERT_TRUE(r.found) << r.status;
    Evaluation ev = evaluate(p, r.solution);
    ASSERT_TRUE(ev.valid) << ev.violation;
    EXPECT_EQ(ev.cost, r.cost);
    EXPECT_EQ(ev.peak_usage, r.peak_usage);
    EXPECT_LE(ev.peak_usage, p.usage_limit);
    const Cost optimum = 532843;  // proven optimal (Gurobi), README of the instances
    EXPECT_GE(r.cost, optimum);
    EXPECT_LE(r.lower_bound, optimum);
    if (r.proven_optimal) {
      EXPECT_EQ(r.cost, optimum);
    }
    EXPECT_GE(r.time_to_first_s, 0.0);
    EXPECT_LE(r.total_time_s, o.time_limit_s + 5.0);
  }
}

TEST(SolveDispatch, InfeasibleProblemIsNotReportedAsFound) {
  Problem p;
  p.node_costs = {{1, 2}, {3}};
  p.node_usages = {{4, 5}, {2}};
  p.intervals = {{0, 2}, {1, 3}};
  p.usage_limit = 5;  // node 1 (2) + node 0 (>= 4) overlap at t=1
  p.edges.push_back({0, 1, {0, 0}});
  SolveResult r = solve(p, SolveOptions{});
  EXPECT_FALSE(r.found);
  EXPECT_FALSE(r.proven_optimal);
  p.usage_limit = 6;
  r = solve(p, SolveOptions{});
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.cost, 1 + 3);
  EXPECT_TRUE(r.proven_optimal);
}

TEST(SolveDispatch, MalformedProblemIsRejected) {
  Problem p;
  p.node_costs = {{1, 2}, {3}};
  p.edges.push_back({0, 1, {0}});  // needs 2 x 1 entries
  EXPECT_THROW(solve(p, SolveOptions{}), ProblemError);
}
