// Seeded mutations of problem files and graph files through the command line: every case
// must end in a clear error (exit code 1-3 and a message) or a plan that the independent
// evaluator accepts at the printed cost; never a crash, an escaped exception or a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "autoshard/clock.h"
#include "autoshard/cli.h"
#include "autoshard/evaluate.h"
#include "autoshard/graph.h"
#include "autoshard/problem_io.h"
#include "autoshard/planner.h"

#include "test_cli_run.h"
#include "io/json.h"
#include "io/graph_json.h"
#include "io/plan_json.h"

using namespace autoshard;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// A small valid problem with a memory limit, a budget and an infeasible entry.
const char* kProblem =
    R"({"problem": {"name": "fuzz", "nodes": {"costs": [[10, 20, 1000000000000000000], [5, 1], [7, 3, 2]],)"
    R"( "usages": [[4, 2, 1], [3, 3], [1, 2, 5]], "intervals": [[0, 3], [1, 2], [2, 4]]},)"
    R"( "edges": {"nodes": [[0, 1], [1, 2], [0, 2]], "costs": [[0, 1, 2, 3, 4, 5], [1, 0, 2, 3, 0, 1], [0, 0, 9, 1, 1, 0, 2, 2, 2]]},)"
    R"( "usage_limit": 8, "budgets": [{"name": "b", "usages": [[1, 2, 3], [], [1, 1, 1]], "low": 1, "high": 4}]}})";

// Text mutations that keep most of the document, so the readers see almost-valid input;
// `numbers_only` keeps the JSON well formed more often (changed values, not syntax).
std::string mutate(std::string s, std::mt19937& rng, bool numbers_only = false) {
  auto uni = [&](size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(rng); };
  static const std::vector<std::string> tokens = {"-1",
                                                  "0",
                                                  "1",
                                                  "2.5",
                                                  "1e18",
                                                  "1e300",
                                                  "-1e300",
                                                  "999999999999999999",
                                                  "99999999999999999999",
                                                  "9007199254740993",
                                                  "NaN",
                                                  "Infinity",
                                                  "null",
                                                  "true",
                                                  "\"x\"",
                                                  "[]",
                                                  "{}",
                                                  "[[0, 1]]",
                                                  "\xEF\xBB\xBF",
                                                  "\xFF",
                                                  "\xC3",
                                                  "\\u0000",
                                                  "2147483648",
                                                  "-9223372036854775808",
                                                  "1e-9",
                                                  "65536"};
  const int edits = static_cast<int>(uni(1, 3));
  for (int k = 0; k < edits && !s.empty(); ++k) {
    const size_t at = uni(0, s.size() - 1);
    switch (numbers_only ? 6 : uni(0, 6)) {
      case 0:
        s[at] = static_cast<char>(uni(0, 255));
        break;  // flip a byte
      case 1:
        s.erase(at, uni(1, 8));
        break;  // drop a few bytes
      case 2:
        s.insert(at, tokens[uni(0, tokens.size() - 1)]);
        break;  // insert a token
      case 3:
        s.resize(at);
        break;  // cut short
      case 4:
        s.insert(at, s.substr(uni(0, s.size() - 1), uni(1, 16)));
        break;    // duplicate a run
      default: {  // replace a number
        size_t b = at;
        while (b < s.size() && !(s[b] >= '0' && s[b] <= '9')) ++b;
        size_t e = b;
        while (e < s.size() && ((s[e] >= '0' && s[e] <= '9') || s[e] == '.')) ++e;
        if (b < s.size()) s.replace(b, e - b, tokens[uni(0, tokens.size() - 1)]);
      }
    }
  }
  return s;
}

// A failed run must say why: its exit code is an error code and stderr names the command.
void expect_clear_error(const CliRun& r, const std::string& what) {
  EXPECT_TRUE(r.rc >= 1 && r.rc <= 3) << what << " rc " << r.rc;
  EXPECT_NE(r.err.find("autoshard "), std::string::npos) << what << ": " << r.err;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << what;
}

}  // namespace

TEST(FuzzInputs, MutatedProblemFilesGetAnErrorOrAValidPlan) {
  const std::string in = ::testing::TempDir() + "autoshard_fuzz_problem.json";
  const std::string sol = ::testing::TempDir() + "autoshard_fuzz_solution.json";
  ASSERT_EQ(run_cli({"solve", (write_text(in, kProblem), in), "--time-limit", "2"}).rc, 0);
  std::mt19937 rng(20250611);
  int solved = 0;
  for (int c = 0; c < 400; ++c) {
    const std::string text = mutate(kProblem, rng, c % 2 == 0);
    write_text(in, text);
    std::remove(sol.c_str());
    const auto t0 = Clock::now();
    CliRun r = run_cli({"solve", in, "--time-limit", "1", "--out", sol});
    const std::string what = "case " + std::to_string(c);
    EXPECT_LT(seconds_since(t0), 5.0) << what;
    if (r.rc != 0) {
      expect_clear_error(r, what);
      continue;
    }
    ++solved;
    // The plan written must be valid for the problem as read, at the cost printed.
    Problem p = read_problem(in);
    Evaluation ev = evaluate(p, read_solution(sol, p));
    EXPECT_TRUE(ev.valid) << what << ": " << ev.violation;
    const size_t at = r.out.find("\ncost: ");
    ASSERT_NE(at, std::string::npos) << what << ": " << r.out;
    EXPECT_EQ(std::stod(r.out.substr(at + 7)), ev.cost) << what << ": " << r.out << "\n" << text;
  }
  EXPECT_GT(solved, 20);  // the mutations leave many files valid
  std::remove(in.c_str());
  std::remove(sol.c_str());
}

TEST(FuzzInputs, MutatedGraphFilesGetAnErrorOrAPlan) {
  const std::string base = std::string(AUTOSHARD_SOURCE_DIR) + "/tests/cpp/data/";
  const std::string in = ::testing::TempDir() + "autoshard_fuzz_graph.json";
  const std::string plan = ::testing::TempDir() + "autoshard_fuzz_plan.json";
  std::mt19937 rng(7);
  int planned = 0;
  for (int c = 0; c < 300; ++c) {
    const bool small = c % 4 != 0;  // linear_fwd plans in milliseconds; mlp2 uses its time limit
    const std::string text =
        mutate(read_text(base + (small ? "linear_fwd.json" : "mlp2_fwd_bwd.json")), rng, c % 3 != 0);
    write_text(in, text);
    std::remove(plan.c_str());
    const auto t0 = Clock::now();
    CliRun r = run_cli({"plan", in, "--mesh", c % 2 ? "2x2" : "4", "--time-limit", "0.05", "--out", plan});
    const std::string what = "case " + std::to_string(c);
    EXPECT_LT(seconds_since(t0), 5.0) << what;
    if (r.rc != 0) {
      expect_clear_error(r, what);
      continue;
    }
    ++planned;
    // The plan names every node of the graph as read, each with its output layouts.
    Graph g = read_graph_file(in);
    Json doc = parse_json(read_text(plan));
    for (const Node& n : g.nodes) EXPECT_NE(json_find(doc.at("nodes"), n.name), nullptr) << what << ": " << n.name;
  }
  EXPECT_GE(planned, 5);  // most mutated graphs are refused by the reader, some still plan
  std::remove(in.c_str());
  std::remove(plan.c_str());
}

// The options JSON the Python API sends: mutated values must be refused with a message
// (naming the field) or planned within the time asked for.
TEST(FuzzInputs, MutatedPlannerOptionsGetAnErrorOrAPlan) {
  const std::string graph = read_text(std::string(AUTOSHARD_SOURCE_DIR) + "/tests/cpp/data/linear_fwd.json");
  const std::string options =
      R"({"mesh": {"shape": [2, 2], "dim_names": ["dp", "tp"]}, "hardware": "H100",)"
      R"( "parameter_memory": {"low": 0.0, "high": 0.25}, "memory_limit_bytes": 80000000000,)"
      R"( "input_constraints": {}, "output_constraints": {}, "node_constraints": {}, "time_limit_s": 1.5,)"
      R"( "max_problem_bytes": 1000000000, "verbose": false})";
  ASSERT_FALSE(plan_graph_json(graph, options).empty());
  std::mt19937 rng(11);
  int planned = 0;
  for (int c = 0; c < 300; ++c) {
    const std::string text = mutate(options, rng, c % 3 != 0);
    const auto t0 = Clock::now();
    try {
      Json plan = parse_json(plan_graph_json(graph, text));
      EXPECT_NE(json_find(plan, "nodes"), nullptr) << text;
      ++planned;
    } catch (const std::exception& e) {
      EXPECT_GT(std::string(e.what()).size(), 10u) << text;
    }
    EXPECT_LT(seconds_since(t0), 5.0) << text;
  }
  EXPECT_GE(planned, 10);
}
