// Problem reader/writer and evaluation: round trips, every validation error names the field,
// and evaluate() matches hand-computed values (including half-open interval semantics).
#include <gtest/gtest.h>

#include "test_data_paths.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "autoshard/evaluate.h"
#include "autoshard/problem_io.h"

using namespace autoshard;

namespace {

// Two nodes, one edge: node 0 has 2 strategies, node 1 has 3.
const char* kSmall = R"({"problem": {
  "name": "small",
  "nodes": {"costs": [[1, 2], [10, 20, 30]],
            "usages": [[5, 1], [3, 4, 0]],
            "intervals": [[0, 2], [2, 4]]},
  "edges": {"nodes": [[0, 1]], "costs": [[100, 200, 300, 400, 500, 600]]},
  "usage_limit": 5}})";

std::string error_of(const std::string& text) {
  try {
    parse_problem(text, "in.json");
  } catch (const ProblemError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string small_with(const std::string& from, const std::string& to) {
  std::string s = kSmall;
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST(ProblemIo, ReadsAllFields) {
  Problem p = parse_problem(kSmall);
  EXPECT_EQ(p.name, "small");
  ASSERT_EQ(p.num_nodes(), 2u);
  EXPECT_EQ(p.num_strategies(1), 3u);
  EXPECT_EQ(p.node_usages[1][1], 4);
  EXPECT_EQ(p.intervals[1].start, 2);
  EXPECT_EQ(p.intervals[1].end, 4);
  ASSERT_EQ(p.edges.size(), 1u);
  EXPECT_EQ(p.edges[0].costs[5], 600);
  EXPECT_EQ(p.usage_limit, 5);
}

TEST(ProblemIo, RoundTripsThroughFileIncludingBudgets) {
  Problem p = parse_problem(kSmall);
  p.budgets.push_back({"params", {{1, 2}, {}}, 1, 7});
  p.node_names = {"a", "b"};
  auto path = std::filesystem::temp_directory_path() / "autoshard_test_roundtrip.json";
  write_problem(p, path.string());
  Problem q = read_problem(path.string());
  EXPECT_EQ(q.node_costs, p.node_costs);
  EXPECT_EQ(q.node_usages, p.node_usages);
  EXPECT_EQ(q.edges[0].costs, p.edges[0].costs);
  EXPECT_EQ(q.usage_limit, p.usage_limit);
  EXPECT_EQ(q.node_names, p.node_names);
  ASSERT_EQ(q.budgets.size(), 1u);
  EXPECT_EQ(q.budgets[0].name, "params");
  EXPECT_EQ(q.budgets[0].usage[1], (std::vector<int64_t>{0, 0, 0}));  // empty row written as zeros
  EXPECT_EQ(q.budgets[0].low, 1);
  EXPECT_EQ(q.budgets[0].high, 7);
  std::filesystem::remove(path);
}

TEST(ProblemIo, UsageLimitAndIntervalsAreOptionalTogether) {
  Problem p = parse_problem(R"({"problem": {"nodes": {"costs": [[1]]}, "edges": {"nodes": [], "costs": []}}})");
  EXPECT_EQ(p.usage_limit, -1);
  EXPECT_NE(error_of(R"({"problem": {"nodes": {"costs": [[1]], "usages": [[1]]}, "edges": {"nodes": [], "costs": []},
      "usage_limit": 3}})"), "(no error)");
}

TEST(ProblemIo, ErrorsNameWhatAndWhere) {
  EXPECT_NE(error_of("{\"problem\": \n {\"nodes\": [1,}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("top level"), std::string::npos);
  EXPECT_NE(error_of("{}").find("\"problem\""), std::string::npos);
  EXPECT_NE(error_of(small_with("\"edges\": {\"nodes\"", "\"edges\": {\"nodez\"")).find("problem.edges: missing key \"nodes\""),
            std::string::npos);
  std::string e = error_of(small_with("[100, 200, 300, 400, 500, 600]", "[100, 200, 300]"));
  EXPECT_NE(e.find("problem.edges.costs[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("2 x 3 = 6"), std::string::npos) << e;
  EXPECT_NE(e.find("has 3 costs"), std::string::npos) << e;
  e = error_of(small_with("[[0, 1]]", "[[0, 7]]"));
  EXPECT_NE(e.find("problem.edges.nodes[0][1]: node id 7 is out of range"), std::string::npos) << e;
  e = error_of(small_with("[2, 4]]", "[4, 2]]"));
  EXPECT_NE(e.find("problem.nodes.intervals[1]: interval end 2 is before its start 4"), std::string::npos) << e;
  e = error_of(small_with("[3, 4, 0]", "[3, -4, 0]"));
  EXPECT_NE(e.find("problem.nodes.usages[1][1]: negative usage -4"), std::string::npos) << e;
  e = error_of(small_with("[3, 4, 0]", "[3, 99999999999999999999, 0]"));
  EXPECT_NE(e.find("problem.nodes.usages[1][1]"), std::string::npos) << e;
  EXPECT_NE(e.find("64 bits"), std::string::npos) << e;
  e = error_of(small_with("[10, 20, 30]", "[10, 20, 99999999999999999999]"));
  EXPECT_NE(e.find("problem.nodes.costs[1][2]"), std::string::npos) << e;
  EXPECT_NE(e.find("64 bits"), std::string::npos) << e;
  e = error_of(small_with("[[1, 2], [10, 20, 30]]", "[[1, 2], []]"));
  EXPECT_NE(e.find("node 1 has no strategies"), std::string::npos) << e;
  e = error_of(small_with("[[5, 1], [3, 4, 0]]", "[[5, 1], [3, 4]]"));
  EXPECT_NE(e.find("problem.nodes.usages[1]: has 2 entries but node 1 has 3 strategies"), std::string::npos) << e;
  e = error_of(small_with("[[0, 2], [2, 4]]", "[[0, 2]]"));
  EXPECT_NE(e.find("problem.nodes.intervals: has 1 entries"), std::string::npos) << e;
  e = error_of(small_with("\"costs\": [[100", "\"costs\": [[100, 1, 1, 1, 1, 1], [100"));
  EXPECT_NE(e.find("\"nodes\" has 1 entries but \"costs\" has 2"), std::string::npos) << e;
  e = error_of(small_with("[1, 2]", "[1, \"x\"]"));
  EXPECT_NE(e.find("problem.nodes.costs[0][1]: expected a number, found string"), std::string::npos) << e;
  EXPECT_EQ(error_of(kSmall), "(no error)");
}

TEST(ProblemIo, MissingFileAndBadGzipAreReported) {
  try {
    read_problem("/nonexistent/problem.json");
    FAIL();
  } catch (const ProblemError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/problem.json"), std::string::npos);
  }
}

TEST(ProblemIo, ReadsTheIopddlInstanceB) {
  AUTOSHARD_REQUIRE_INSTANCE(path_b, "B.json.gz");
  Problem p = read_problem(path_b);
  EXPECT_EQ(p.num_nodes(), 816u);
  EXPECT_EQ(p.edges.size(), 1096u);
  EXPECT_EQ(p.usage_limit, 14392528);
}

TEST(ProblemIo, SolutionRoundTripAndChecks) {
  Problem p = parse_problem(kSmall);
  auto path = (std::filesystem::temp_directory_path() / "autoshard_test_solution.json").string();
  write_solution({1, 2}, path);
  EXPECT_EQ(read_solution(path, p), (Solution{1, 2}));
  write_solution({1, 3}, path);
  EXPECT_THROW(read_solution(path, p), ProblemError);
  std::filesystem::remove(path);
}

TEST(Evaluate, HandComputedCostAndHalfOpenIntervals) {
  Problem p = parse_problem(kSmall);
  // Plan (0, 1): node costs 1 + 20, edge entry [0*3 + 1] = 200.
  Evaluation ev = evaluate(p, {0, 1});
  EXPECT_EQ(ev.cost, 221);
  // Node 0 is live on [0,2) with usage 5, node 1 on [2,4) with usage 4: never together.
  EXPECT_EQ(ev.peak_usage, 5);
  EXPECT_TRUE(ev.valid) << ev.violation;
  // Overlapping intervals: the same plan now needs 9 > 5.
  p.intervals[1] = {1, 4};
  ev = evaluate(p, {0, 1});
  EXPECT_EQ(ev.peak_usage, 9);
  EXPECT_EQ(ev.peak_time, 1);
  EXPECT_FALSE(ev.memory_ok);
  EXPECT_FALSE(ev.valid);
  EXPECT_NE(ev.violation.find("exceeds the limit 5"), std::string::npos);
  ev = evaluate(p, {1, 2});  // 1 + 0 fits
  EXPECT_TRUE(ev.valid);
  EXPECT_EQ(ev.cost, 2 + 30 + 600);
}

TEST(Evaluate, InfeasibleChoicesBudgetsAndMalformedPlans) {
  Problem p = parse_problem(kSmall);
  p.edges[0].costs[0] = kInfeasibleCost;
  Evaluation ev = evaluate(p, {0, 0});
  EXPECT_TRUE(ev.takes_infeasible);
  EXPECT_FALSE(ev.valid);
  EXPECT_NE(ev.violation.find("edge 0"), std::string::npos);
  p.node_costs[1][1] = 2e18;
  EXPECT_TRUE(evaluate(p, {1, 1}).takes_infeasible);
  p.budgets.push_back({"b", {{3, 1}, {0, 0, 0}}, 2, 10});
  ev = evaluate(p, {1, 2});
  ASSERT_EQ(ev.budget_sums.size(), 1u);
  EXPECT_EQ(ev.budget_sums[0], 1);
  EXPECT_FALSE(ev.budgets_ok);
  EXPECT_FALSE(ev.valid);
  EXPECT_TRUE(evaluate(p, {0, 2}).budgets_ok);
  EXPECT_FALSE(evaluate(p, {0}).well_formed);
  EXPECT_FALSE(evaluate(p, {0, 3}).well_formed);
  EXPECT_FALSE(evaluate(p, {-1, 0}).valid);
}

TEST(ProblemIo, IntegerCostsProveOptimalityOnceTheRoundedUpBoundMeetsTheCost) {
  // The optimum of an integer problem is an integer >= the bound: a bound 0.6 below the
  // cost leaves no cheaper plan; a whole unit below does.
  EXPECT_TRUE(bound_proves_optimal(532844, 532843.4, true));
  EXPECT_TRUE(bound_proves_optimal(532844, 532844, true));
  EXPECT_FALSE(bound_proves_optimal(532844, 532843, true));
  EXPECT_FALSE(bound_proves_optimal(532844, 532843.2, true));  // within the noise allowance of a unit
  // fractional costs: only floating-point noise is forgiven
  EXPECT_FALSE(bound_proves_optimal(532844, 532843.4, false));
  EXPECT_TRUE(bound_proves_optimal(532844, 532844 - 1e-6, false));
}
