// Problem reader/writer and evaluation: round trips, every validation error names the field,
// and evaluate() matches hand-computed values (including half-open interval semantics).
#include <gtest/gtest.h>

#include "test_data_paths.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "autoshard/evaluate.h"
#include "autoshard/problem_io.h"
#include "io/json.h"
#include "io/problem_json.h"
#include "io/read_file.h"

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
      "usage_limit": 3}})"),
            "(no error)");
}

TEST(ProblemIo, ErrorsNameWhatAndWhere) {
  EXPECT_NE(error_of("{\"problem\": \n {\"nodes\": [1,}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("top level"), std::string::npos);
  EXPECT_NE(error_of("{}").find("\"problem\""), std::string::npos);
  EXPECT_NE(error_of(small_with("\"edges\": {\"nodes\"", "\"edges\": {\"nodez\""))
                .find("problem.edges: missing key \"nodes\""),
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

// parse_problem builds the problem from the parser's events and leaves anything it does not
// accept to the document reader (problem_from_json), which words the errors: both must read
// every input alike, whatever the key order, unknown keys, repeated keys and number forms.
namespace {

Problem tree_read(const std::string& text, const std::string& source) {
  Json doc;
  try {
    doc = parse_json(text);
  } catch (const JsonError& e) {
    throw ProblemError(source + ": " + e.what());
  }
  return problem_from_json(doc, source);
}

void expect_same(const Problem& a, const Problem& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.node_costs, b.node_costs);
  EXPECT_EQ(a.node_usages, b.node_usages);
  ASSERT_EQ(a.intervals.size(), b.intervals.size());
  for (size_t i = 0; i < a.intervals.size(); ++i) {
    EXPECT_EQ(a.intervals[i].start, b.intervals[i].start);
    EXPECT_EQ(a.intervals[i].end, b.intervals[i].end);
  }
  ASSERT_EQ(a.edges.size(), b.edges.size());
  for (size_t e = 0; e < a.edges.size(); ++e) {
    EXPECT_EQ(a.edges[e].u, b.edges[e].u);
    EXPECT_EQ(a.edges[e].v, b.edges[e].v);
    EXPECT_EQ(a.edges[e].costs, b.edges[e].costs);
  }
  EXPECT_EQ(a.usage_limit, b.usage_limit);
  ASSERT_EQ(a.budgets.size(), b.budgets.size());
  for (size_t k = 0; k < a.budgets.size(); ++k) {
    EXPECT_EQ(a.budgets[k].name, b.budgets[k].name);
    EXPECT_EQ(a.budgets[k].usage, b.budgets[k].usage);
    EXPECT_EQ(a.budgets[k].low, b.budgets[k].low);
    EXPECT_EQ(a.budgets[k].high, b.budgets[k].high);
  }
  EXPECT_EQ(a.node_names, b.node_names);
}

std::string outcome(const std::function<Problem()>& read) {
  try {
    read();
  } catch (const ProblemError& e) {
    return e.what();
  }
  return "(read)";
}

}  // namespace

TEST(ProblemIo, EventReaderReadsAsTheDocumentReader) {
  const std::vector<std::string> good = {
      kSmall,
      // edges before nodes, unknown keys holding any value, floats with integral values
      R"({"x": [1, {"y": null}], "problem": {"edges": {"costs": [[1.5, 2, 3e2]], "note": "n", "nodes": [[1.0, 0]]},
          "extra": {"a": [[[]]]}, "usage_limit": 9.0,
          "nodes": {"intervals": [[0, 3], [-2, -2]], "usages": [[0, 7.0, 1], [2]], "costs": [[1, 2, 3], [-4]],
                    "names": ["a", "b\u00e9"]},
          "budgets": [{"usages": [[1, 2, 3], []], "high": 5, "name": "params", "z": true},
                      {"usages": [[], [0]], "low": -1}], "name": "reordered"}})",
      // no limit (null), no usages or intervals, infeasible and large exact costs
      R"({"problem": {"nodes": {"costs": [[1000000000000000000, 9007199254740992], [2e18]]}, "usage_limit": null,
          "edges": {"nodes": [], "costs": []}}})",
      // white space everywhere, numbers the event reader leaves to RapidJSON (over 40 bytes,
      // 2^63 in an ignored row), exponents and negative zero
      R"( { "problem" : { "nodes" : { "costs" : [ [ 1 , 2.50 , -0.0 ] ,
          [1.000000000000000000000000000000000000000000001, 25e-1, 0.25E+1 ] ] } , "ignored": [[9223372036854775808]],
          "edges" : { "nodes" : [ [ 0 , 1 ] ] , "costs" : [[ 1,2,3,4,5,6,7,8,9 ]] } } } )",
      // a repeated key: the document reader keeps the last value (the event reader leaves it)
      R"({"problem": {"nodes": {"costs": [[1]], "costs": [[1, 2]]}, "edges": {"nodes": [], "costs": []}}})",
  };
  for (const std::string& text : good) {
    SCOPED_TRACE(text);
    // The event reader takes all but the repeated key (it would pass silently to the slower
    // document reader otherwise).
    EXPECT_EQ(read_problem_events(text).has_value(), &text != &good.back());
    Problem a, b;
    ASSERT_EQ(outcome([&] { return a = parse_problem(text, "in.json"); }), "(read)");
    b = tree_read(text, "in.json");
    expect_same(a, b);
  }
  const std::vector<std::string> bad = {
      "",
      "[]",
      R"({"problem": []})",
      R"({"problem": {"nodes": {"costs": [[1]]}}})",
      R"({"problem": {"nodes": {"costs": [[]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]], "usages": [[-1]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]]}, "edges": {"nodes": [[0, 1]], "costs": [[1]]}}})",
      R"({"problem": {"nodes": {"costs": [[1]]}, "edges": {"nodes": [[0, 0]], "costs": [[1, 2]]}}})",
      R"({"problem": {"nodes": {"costs": [[9007199254740994]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1e300]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]], "intervals": [[2, 1]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]]}, "usage_limit": 5, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]]}, "usage_limit": 1.5, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]]}, "budgets": [{"usages": [[1]], "low": 2, "high": 1}],
          "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]]}, "budgets": [{"low": null, "usages": [[1]]}], "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"name": 3, "nodes": {"costs": [[1]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1]]}, "edges": {"nodes": [], "costs": []}}} x)",
      R"({"problem": {"nodes": {"costs": [[NaN]]}, "edges": {"nodes": [], "costs": []}}})",
      // malformed rows of numbers
      R"({"problem": {"nodes": {"costs": [[1 2]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1,]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[01]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1, [2]]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1.]]}, "edges": {"nodes": [], "costs": []}}})",
      R"({"problem": {"nodes": {"costs": [[1, "2"]]}, "edges": {"nodes": [], "costs": []}}})",
  };
  for (const std::string& text : bad) {
    SCOPED_TRACE(text);
    const std::string e = outcome([&] { return parse_problem(text, "in.json"); });
    EXPECT_NE(e, "(read)");
    EXPECT_EQ(e, outcome([&] { return tree_read(text, "in.json"); }));
  }
}

TEST(ProblemIo, EventReaderReadsTheIopddlInstancesAsTheDocumentReader) {
  for (const char* file : {"B.json.gz", "G.json.gz"}) {
    const std::string path = iopddl_instance(file);
    if (path.empty()) GTEST_SKIP() << file << " is not on this machine";
    const std::string text = read_file_maybe_gzip(path);
    ASSERT_TRUE(read_problem_events(text).has_value()) << file;
    expect_same(read_problem(path), tree_read(text, path));
  }
}
