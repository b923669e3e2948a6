// Planner options that used to be relaxed or misread silently (issue 11): parameter-memory
// budgets below what any plan can store, non-positive memory limits, zero/NaN/infinite or
// huge time limits, meshes whose problem cannot fit in memory, and plan output paths that
// would overwrite the graph. Each gets a plan that honours it or an error naming the fix.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "autoshard/clock.h"
#include "autoshard/cli.h"
#include "autoshard/planner.h"

#include "test_cli_run.h"
#include "test_data_paths.h"
#include "test_planner_util.h"
#include "io/json.h"
#include "io/graph_json.h"
#include "io/options_json.h"
#include "io/plan_json.h"

using namespace autoshard;

namespace {}  // namespace

TEST(PlannerLimits, ParameterMemoryBelowOneOverMeshSizeIsRefused) {
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  for (double high : {0.0, 1e-9, 0.1}) {
    PlannerOptions o = planner_options({4});
    o.parameter_memory_default = false;
    o.parameter_memory = std::make_pair(0.0, high);
    std::string e = error_of([&] { run_planner(g, o); });
    EXPECT_NE(e.find("is below 0.25 = 1/4, the least fraction of the parameters any plan can store per GPU"),
              std::string::npos)
        << high << ": " << e;
    EXPECT_NE(e.find("pass high >= 0.25"), std::string::npos) << e;
  }
  // The same through the options JSON (the Python API's add_parameter_memory_constraint).
  std::string e = error_of([] {
    parse_planner_options(parse_json(R"({"mesh": {"shape": [2, 2]}, "parameter_memory": {"low": 0, "high": 0.1}})"));
  });
  EXPECT_NE(e.find("high=0.1 is below 0.25 = 1/4"), std::string::npos) << e;
  CliRun r = run_cli({"plan", test_data("linear_fwd.json"), "--mesh", "4", "--param-memory", "0,0"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("high=0 is below 0.25 = 1/4"), std::string::npos) << r.err;
  // Exactly 1/mesh size is what full sharding reaches: allowed, and honoured.
  PlannerOptions o = planner_options({4});
  o.parameter_memory_default = false;
  o.parameter_memory = std::make_pair(0.0, 0.25);
  PlanningResult plan = run_planner(g, o);
  EXPECT_EQ(plan.plan.cost.parameter_bytes_per_gpu * 4, g.nodes[0].outputs[0]->bytes());
}

TEST(PlannerLimits, NonPositiveMemoryLimitsAreRefused) {
  for (const char* bad : {"-1", "0", "nan", "1.5", "1e30", "lots"}) {
    CliRun r = run_cli({"plan", test_data("linear_fwd.json"), "--mesh", "4", "--memory-limit", bad});
    EXPECT_EQ(r.rc, 1) << bad;
    EXPECT_NE(r.err.find("--memory-limit (leave it out for no limit)"), std::string::npos) << r.err;
  }
  for (const char* bad : {"0", "-1"}) {
    std::string e = error_of([&] {
      parse_planner_options(parse_json(std::string(R"({"mesh": {"shape": [4]}, "memory_limit_bytes": )") + bad + "}"));
    });
    EXPECT_NE(e.find("for no limit leave it out (or null)"), std::string::npos) << e;
  }
  PlannerOptions o = planner_options({4});
  o.memory_limit_bytes = 0;
  EXPECT_NE(error_of([&] { run_planner(read_graph_file(test_data("linear_fwd.json")), o); }).find("must be > 0 bytes"),
            std::string::npos);
}

TEST(PlannerLimits, TimeLimitsAreCheckedWhereTheyEnterAndHugeOnesCapped) {
  for (const char* bad : {"0", "-1", "nan", "inf"}) {
    CliRun r = run_cli({"plan", test_data("linear_fwd.json"), "--mesh", "4", "--time-limit", bad});
    EXPECT_EQ(r.rc, 1) << bad;
    EXPECT_NE(r.err.find("--time-limit must be a finite number of seconds > 0"), std::string::npos) << r.err;
  }
  std::string e = error_of([] { parse_planner_options(parse_json(R"({"mesh": {"shape": [4]}, "time_limit_s": 0})")); });
  EXPECT_NE(e.find("options.time_limit_s must be a finite number of seconds > 0"), std::string::npos) << e;
  // 1e10 s used to overflow the clock (a deadline in the past) and return a poor plan.
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  PlannerOptions o = planner_options({2, 2});
  PlanningResult normal = run_planner(g, o);
  o.time_limit_s = 1e10;
  PlanningResult huge = run_planner(g, o);
  EXPECT_TRUE(huge.plan.proven_optimal);
  EXPECT_DOUBLE_EQ(huge.plan.cost.total_us, normal.plan.cost.total_us);
}

TEST(PlannerLimits, MeshTooLargeForMemoryIsRefusedBeforeBuilding) {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options({2, 2, 2, 2, 2});
  o.max_problem_bytes = 1'000'000'000;
  const auto t0 = Clock::now();
  std::string e = error_of([&] { run_planner(g, o); });
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_NE(e.find("the solver problem for this graph on mesh 2x2x2x2x2 is estimated to need"), std::string::npos) << e;
  EXPECT_NE(e.find("above the memory cap of 1.0 GB (set by --max-problem-bytes / max_problem_bytes)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("use a mesh with fewer dimensions"), std::string::npos) << e;
  // A small cap stops the enumeration itself.
  o.max_problem_bytes = 100'000;
  e = error_of([&] { run_planner(g, o); });
  EXPECT_NE(e.find("enumerating the strategies of node"), std::string::npos) << e;
  // The CLI option and the JSON field reach the same cap.
  CliRun r = run_cli({"plan", test_data("mlp2_fwd_bwd.json"), "--mesh", "2x2x2x2x2", "--max-problem-bytes", "1e9"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("above the memory cap of 1.0 GB"), std::string::npos) << r.err;
  EXPECT_EQ(
      parse_planner_options(parse_json(R"({"mesh": {"shape": [4]}, "max_problem_bytes": 12345})")).max_problem_bytes,
      12345);
}

TEST(PlannerLimits, TimeLimitHoldsWhileBuildingTheProblem) {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options({2, 2, 2, 2, 2});
  o.max_problem_bytes = int64_t{1} << 50;  // let it try: the clock must stop it
  o.time_limit_s = 0.3;
  const auto t0 = Clock::now();
  std::string e = error_of([&] { run_planner(g, o); });
  EXPECT_LT(seconds_since(t0), 3.0);
  EXPECT_NE(e.find("the time limit (0.3 s, --time-limit / time_limit_s) ran out while"), std::string::npos) << e;
  EXPECT_NE(e.find("before the solver started; raise the time limit"), std::string::npos) << e;
}

TEST(PlannerCliInputs, OutputOverTheGraphAndDirectoriesAreRefused) {
  namespace fs = std::filesystem;
  const std::string graph = ::testing::TempDir() + "autoshard_limits_graph.json";
  fs::copy_file(test_data("linear_fwd.json"), graph, fs::copy_options::overwrite_existing);
  const auto size = fs::file_size(graph);
  CliRun r = run_cli({"plan", graph, "--mesh", "4", "--out", graph});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("would overwrite the input"), std::string::npos) << r.err;
  EXPECT_EQ(fs::file_size(graph), size);
  std::remove(graph.c_str());
  r = run_cli({"plan", ::testing::TempDir(), "--mesh", "4"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("is a directory, not a file"), std::string::npos) << r.err;
  r = run_cli({"plan", test_data("linear_fwd.json"), "--mesh", "2.5"});
  EXPECT_NE(r.err.find("--mesh: '2.5' is not sizes >= 1 joined by 'x'"), std::string::npos) << r.err;
}

// A pinned parameter cannot be sharded to the budget's share; the budget is raised for it
// (as AutoParallel does) and the report says so instead of relaxing it silently.
TEST(PlannerLimits, BudgetRaisedForPinnedParametersIsReported) {
  std::ifstream f(test_data("linear_fwd.json"));
  std::stringstream graph;
  graph << f.rdbuf();
  Json plan =
      parse_json(plan_graph_json(graph.str(), R"({"mesh": {"shape": [4]}, "input_constraints": {"w": ["R"]}})"));
  const std::string& report = json_string(plan.at("report"));
  EXPECT_NE(report.find("note: the parameter memory budget (high = 0.25 of each parameter) cannot be met by 1 "
                        "parameter(s), so their share was raised to the least any strategy reaches: w (pinned) at "
                        "least 1 of itself"),
            std::string::npos)
      << report;
  Json plain = parse_json(plan_graph_json(graph.str(), R"({"mesh": {"shape": [4]}})"));
  EXPECT_EQ(json_string(plain.at("report")).find("note:"), std::string::npos);
}
