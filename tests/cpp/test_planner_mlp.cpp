// End-to-end planning of small hand-built graphs against ground truth: FSDP-like plans under
// the default parameter-memory budget, DDP-like plans without it, the solver's objective
// against an independent re-evaluation, and brute force over every strategy combination.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "autoshard/cli.h"
#include "autoshard/layout.h"
#include "autoshard/evaluate.h"
#include "autoshard/planner.h"
#include "autoshard/report.h"
#include "autoshard/rules.h"

#include "test_data_paths.h"
#include "test_planner_util.h"
#include "io/json.h"
#include "io/graph_json.h"
#include "io/plan_json.h"
#include "io/read_file.h"

using namespace autoshard;

namespace {

const Layout& output_layout(const PlanningResult& r, const std::string& name) {
  const Graph& g = *r.sharding.graph;
  int32_t i = g.index_by_name.at(name);
  return *r.sharding.strategies[i][r.plan.choice[i]].outputs[0];
}

int64_t param_bytes(const Graph& g) {
  int64_t b = 0;
  for (const auto& n : g.nodes)
    if (n.role == NodeRole::Parameter) b += n.outputs[0]->bytes();
  return b;
}

void expect_objective_matches_evaluation(const PlanningResult& r) {
  EXPECT_NEAR(r.plan.solver_objective_us, r.plan.cost.total_us, 1e-9 * std::max(1.0, r.plan.cost.total_us));
  EXPECT_LE(r.plan.lower_bound_us, r.plan.cost.total_us + 1e-9);
  EXPECT_NEAR(r.plan.cost.compute_us + r.plan.cost.exposed_comm_us, r.plan.cost.total_us, 1e-9);
  EXPECT_LE(r.plan.cost.exposed_comm_us, r.plan.cost.comm_us + 1e-9);
}

// Every gradient leaves in its parameter's layout; the loss leaves replicated.
void expect_outputs_follow_contract(const PlanningResult& r) {
  const Graph& g = *r.sharding.graph;
  for (size_t j = 0; j < g.outputs.size(); ++j) {
    const auto& o = g.outputs[j];
    if (o.role == GraphOutput::Role::Grad)
      EXPECT_EQ(r.plan.cost.output_layouts[j], output_layout(r, g.nodes[o.grad_of].name));
    else
      EXPECT_EQ(r.plan.cost.output_layouts[j], replicate_layout(r.model->mesh.ndim()));
  }
}

class PlannerMlp : public ::testing::TestWithParam<std::vector<int64_t>> {};

}  // namespace

TEST_P(PlannerMlp, DefaultParameterMemoryShardsEveryWeight) {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlanningResult r = run_planner(g, planner_options(GetParam(), 3));
  const Mesh& mesh = r.model->mesh;
  for (const char* w : {"primals_1", "primals_2"}) {
    const Layout& l = output_layout(r, w);
    const TensorMeta& m = *g.nodes[g.index_by_name.at(w)].outputs[0];
    EXPECT_EQ(local_meta(m, l, mesh).bytes() * 4, m.bytes()) << w << " " << layout_str(l);
  }
  EXPECT_EQ(r.plan.cost.parameter_bytes_per_gpu * 4, param_bytes(g));
  // FSDP-like: the batch is sharded on every mesh dim (data parallel) and weights are sharded.
  EXPECT_EQ(num_shards(output_layout(r, "mm"), mesh), 4) << layout_str(output_layout(r, "mm"));
  expect_objective_matches_evaluation(r);
  expect_outputs_follow_contract(r);
}

TEST_P(PlannerMlp, ReplicatedWeightsGiveDDP) {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options(GetParam(), 3);
  o.parameter_memory_default = false;
  o.parameter_memory = std::make_pair(1.0, 1.0);
  PlanningResult r = run_planner(g, o);
  const Mesh& mesh = r.model->mesh;
  // DDP: weights replicated, activations batch-sharded, gradients all-reduced.
  EXPECT_EQ(output_layout(r, "primals_1"), replicate_layout(mesh.ndim()));
  EXPECT_EQ(output_layout(r, "primals_2"), replicate_layout(mesh.ndim()));
  EXPECT_EQ(r.plan.cost.parameter_bytes_per_gpu, param_bytes(g));
  const Layout& act = output_layout(r, "mm");
  for (const auto& p : act) EXPECT_TRUE(p.is_shard(0)) << layout_str(act);
  expect_objective_matches_evaluation(r);
  expect_outputs_follow_contract(r);
}

TEST_P(PlannerMlp, NoParameterBudgetStaysDataParallelAndBeatsDDP) {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options(GetParam(), 3);
  o.parameter_memory_default = false;
  o.parameter_memory = std::make_pair(1.0, 1.0);
  const double ddp = run_planner(g, o).plan.cost.total_us;
  o.parameter_memory = std::make_pair(0.0, 1.0);
  PlanningResult r = run_planner(g, o);
  // Activations (65536 rows) dwarf the weights: the batch stays split on every mesh dim. The
  // weights may be replicated (DDP) or sharded where that is no slower (on a 2-D mesh a
  // reduce-scatter on one dim and an all-reduce of half the gradient beat two all-reduces).
  const Layout& act = output_layout(r, "mm");
  for (const auto& p : act) EXPECT_TRUE(p.is_shard(0)) << layout_str(act);
  EXPECT_LE(r.plan.cost.total_us, ddp * (1 + 1e-9));
  expect_objective_matches_evaluation(r);
  expect_outputs_follow_contract(r);
  // The same with the constraint removed altogether.
  o.parameter_memory.reset();
  PlanningResult free = run_planner(g, o);
  EXPECT_NEAR(free.plan.cost.total_us, r.plan.cost.total_us, 1e-9 * r.plan.cost.total_us);
}

INSTANTIATE_TEST_SUITE_P(Meshes, PlannerMlp, ::testing::Values(std::vector<int64_t>{4}, std::vector<int64_t>{2, 2}));

TEST(PlannerBruteForce, PlanCostEqualsBestOfAllCombinations) {
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  for (auto mesh : {std::vector<int64_t>{4}, std::vector<int64_t>{2, 2}}) {
    for (bool budget : {false, true}) {
      PlannerOptions o = planner_options(mesh, 3);
      o.parameter_memory_default = budget;
      PlanningResult r = run_planner(g, o);
      const auto& st = r.sharding.strategies;
      ASSERT_EQ(g.nodes.size(), 4u);
      // Budget (AutoParallel default): the weight holds at most max(min fraction, 1/4) of itself.
      const TensorMeta& wm = *g.nodes[0].outputs[0];
      RedistributionCache cache(*r.model);
      double best = INFINITY;
      size_t combos = 0;
      std::vector<int32_t> c(4, 0);
      for (c[0] = 0; c[0] < (int)st[0].size(); ++c[0])
        for (c[1] = 0; c[1] < (int)st[1].size(); ++c[1])
          for (c[2] = 0; c[2] < (int)st[2].size(); ++c[2])
            for (c[3] = 0; c[3] < (int)st[3].size(); ++c[3]) {
              ++combos;
              ChoiceCost cc = evaluate_choice(r.sharding, c, cache, r.lowered.overlap);
              if (budget && cc.parameter_bytes_per_gpu * 4 > wm.bytes()) continue;
              best = std::min(best, cc.total_us);
            }
      EXPECT_GT(combos, 100u);
      EXPECT_NEAR(r.plan.cost.total_us, best, 1e-9 * best) << "mesh dims " << mesh.size() << " budget " << budget;
      expect_objective_matches_evaluation(r);
    }
  }
}

TEST(PlannerJson, PlanDocumentFollowsTheFormat) {
  std::ifstream f(test_data("mlp2_fwd_bwd.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string plan_text =
      plan_graph_json(ss.str(), R"j({"mesh": {"shape": [2, 2], "dim_names": ["dp", "tp"]}, "time_limit_s": 3,
                   "input_constraints": {"primals_3": ["S(0)", "S(0)"]}})j");
  Json plan = parse_json(plan_text);
  EXPECT_EQ(json_int(plan.at("version")), 1);
  EXPECT_EQ(json_string(json_array(plan.at("mesh").at("dim_names"))[1]), "tp");
  const Json& nodes = plan.at("nodes");
  EXPECT_EQ(nodes.size(), 20u);
  EXPECT_EQ(nodes.at("primals_3").at("outputs").dump(), R"j([["S(0)","S(0)"]])j");
  const Json& mm = nodes.at("mm");
  EXPECT_EQ(mm.at("inputs").size(), 2u);
  EXPECT_EQ(mm.at("outputs").size(), 1u);
  EXPECT_GT(json_double(mm.at("compute_us")), 0);
  EXPECT_GT(json_int(mm.at("strategies")), 1);
  EXPECT_FALSE(nodes.at("primals_1").contains("inputs"));
  EXPECT_EQ(plan.at("graph_outputs").size(), 3u);
  EXPECT_EQ(json_array(plan.at("graph_outputs"))[0].dump(), R"j(["R","R"])j");
  EXPECT_EQ(json_array(plan.at("graph_outputs"))[1].dump(), json_array(nodes.at("primals_1").at("outputs"))[0].dump());
  const Json& sum = plan.at("summary");
  double total = json_double(sum.at("total_us"));
  EXPECT_NEAR(total, json_double(sum.at("compute_us")) + json_double(sum.at("exposed_comm_us")), 1e-9 * total);
  EXPECT_LE(json_double(sum.at("exposed_comm_us")), json_double(sum.at("comm_us")));
  EXPECT_EQ(json_int(sum.at("parameter_bytes_per_gpu")), 2 * 1024 * 1024 * 4 / 4);
  const std::string& report = json_string(plan.at("report"));
  EXPECT_NE(report.find("w1 [5 nodes]"), std::string::npos) << report;
  EXPECT_NE(report.find("per module"), std::string::npos) << report;
}

TEST(PlannerErrors, BadOptionsAndImpossibleConstraintsSayWhatToChange) {
  std::ifstream f(test_data("mlp2_fwd_bwd.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  auto error_of = [&](const std::string& opts) -> std::string {
    try {
      plan_graph_json(ss.str(), opts);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(
      error_of(R"j({"mesh": {"shape": [4]}, "paramter_memory": null})j").find("unknown field \"paramter_memory\""),
      std::string::npos);
  EXPECT_NE(error_of(R"j({"mesh": {"shape": [0]}})j").find("options.mesh.shape"), std::string::npos);
  EXPECT_NE(error_of(R"j({"mesh": {"shape": [4]}, "hardware": "Z80"})j").find("Z80"), std::string::npos);
  std::string e = error_of(R"j({"mesh": {"shape": [4]}, "node_constraints": {"mm": ["P(max)"]}})j");
  EXPECT_NE(e.find("node constraint 'mm'"), std::string::npos) << e;
  EXPECT_NE(e.find("possible layouts"), std::string::npos) << e;
  e = error_of(R"j({"mesh": {"shape": [4]}, "input_constraints": {"nope": ["R"]}})j");
  EXPECT_NE(e.find("'nope'"), std::string::npos) << e;
  e = error_of(R"j({"mesh": {"shape": [4]}, "output_constraints": {"3": ["R"]}})j");
  EXPECT_NE(e.find("output constraint 3"), std::string::npos) << e;
  e = error_of(R"j({"mesh": {"shape": [4]}, "memory_limit_bytes": 1000, "time_limit_s": 3})j");
  EXPECT_NE(e.find("memory_limit_bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("raise"), std::string::npos) << e;
  e = error_of(R"j({"mesh": {"shape": [4]}, "parameter_memory": {"low": 0.5, "high": 0.25}})j");
  EXPECT_NE(e.find("low"), std::string::npos) << e;
}

TEST(PlannerCli, PlanCommandWritesThePlan) {
  std::string out_path = ::testing::TempDir() + "autoshard_plan_test.json";
  std::ostringstream out, err;
  int rc = cli_main({"plan", test_data("mlp2_fwd_bwd.json"), "--mesh", "2x2", "--dim-names", "dp,tp", "--param-memory",
                     "1,1", "--time-limit", "3", "--out", out_path},
                    out, err);
  ASSERT_EQ(rc, 0) << err.str();
  EXPECT_NE(out.str().find("estimated step"), std::string::npos);
  Json plan = parse_json(read_file_maybe_gzip(out_path));
  EXPECT_EQ(plan.at("nodes").at("primals_1").at("outputs").dump(), R"j([["R","R"]])j");
  std::remove(out_path.c_str());
  std::ostringstream o2, e2;
  EXPECT_EQ(cli_main({"plan", test_data("mlp2_fwd_bwd.json")}, o2, e2), 2);
  EXPECT_NE(e2.str().find("--mesh is required"), std::string::npos);
}

namespace {
// Live bytes per GPU at each step of the execution order, recomputed from the graph: a
// tensor lives from its producer to its last user (graph outputs to the end), parameters
// and buffers always; views alias their input and take nothing.
int64_t independent_peak(const PlanningResult& r) {
  const Graph& g = *r.sharding.graph;
  const int64_t n = static_cast<int64_t>(g.nodes.size());
  std::vector<int64_t> last(n, -1);
  for (int64_t c = 0; c < n; ++c)
    for (const auto& ref : g.nodes[c].tensor_inputs()) last[ref.node] = std::max(last[ref.node], c);
  for (const auto& o : g.outputs) last[o.ref.node] = n;
  int64_t peak = 0;
  for (int64_t t = 0; t <= n; ++t) {
    int64_t live = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Node& node = g.nodes[i];
      bool resident = node.role == NodeRole::Parameter || node.role == NodeRole::Buffer;
      if (!(resident || (i <= t && t <= std::max(i, last[i])))) continue;
      const OpRule* rule = node.op == "placeholder" ? nullptr : RuleRegistry::instance().find(node.op);
      if (rule && rule->is_view) continue;
      const Strategy& s = r.sharding.strategies[i][r.plan.choice[i]];
      for (size_t k = 0; k < node.outputs.size(); ++k)
        if (node.outputs[k]) live += local_meta(*node.outputs[k], *s.outputs[k], r.model->mesh).bytes();
    }
    peak = std::max(peak, live);
  }
  return peak;
}
}  // namespace

TEST(PlannerMemory, MemoryLimitBoundsThePeakOfThePlan) {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options({4}, 3);
  o.parameter_memory_default = false;  // no budget: the memory limit alone must shape the plan
  o.recompute = RecomputeMode::Off;    // the solver's own limit, not recomputation, meets it
  o.memory_limit_bytes = int64_t{1} << 50;
  PlanningResult loose = run_planner(g, o);
  int64_t loose_peak = independent_peak(loose);
  EXPECT_EQ(evaluate(loose.lowered.problem,
                     [&] {
                       Solution s;
                       for (int32_t gi : loose.lowered.graph_node) s.push_back(loose.plan.choice[gi]);
                       return s;
                     }())
                .peak_usage,
            loose_peak);
  // Three quarters of that peak still fit with every activation sharded 4 ways; the plan must honour it.
  o.memory_limit_bytes = loose_peak * 3 / 4;
  PlanningResult tight = run_planner(g, o);
  EXPECT_LE(independent_peak(tight), o.memory_limit_bytes);
  EXPECT_GE(tight.plan.cost.total_us, loose.plan.cost.total_us - 1e-9);
  expect_objective_matches_evaluation(tight);
}

TEST(PlannerReport, ModuleGroupsAndFolding) {
  EXPECT_EQ(module_group("layers.3.attention.wq"), "layers.3");
  EXPECT_EQ(module_group("layers.12"), "layers.12");
  EXPECT_EQ(module_group("w1"), "w1");
  EXPECT_EQ(module_group("encoder.blocks.0.mlp"), "encoder.blocks.0");
  EXPECT_EQ(module_group(""), "(other)");
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options({2, 2}, 3);
  o.parameter_memory_default = false;
  o.parameter_memory = std::make_pair(1.0, 1.0);  // replicated weights: "weight RR" in the report
  PlanningResult r = run_planner(g, o);
  // The loss tangent is pinned to R (one strategy): folded into a constant, not a solver node.
  int32_t tangent = g.index_by_name.at("tangents_1");
  EXPECT_EQ(r.sharding.strategies[tangent].size(), 1u);
  EXPECT_EQ(r.lowered.solver_node[tangent], -1);
  EXPECT_EQ(r.lowered.problem.num_nodes(), g.nodes.size() - 1);
  expect_objective_matches_evaluation(r);
  std::string report = plan_report(r.sharding, r.plan, true);
  EXPECT_NE(report.find("w1 [5 nodes]"), std::string::npos) << report;
  EXPECT_NE(report.find("weight RR"), std::string::npos) << report;
  EXPECT_NE(report.find("tangents_1 placeholder [1, pinned]"), std::string::npos) << report;
}

TEST(PlannerBruteForce, GradientSinkAndTangentPinOnAForwardBackwardLinear) {
  // y = x @ w.T and its weight gradient gw = gy.T @ x, which must leave in w's layout; the
  // tangent gy arrives in y's (replicated) layout. Every combination on a 4-GPU mesh.
  Graph g = read_graph_file(test_data("linear_fwd_bwd.json"));
  for (bool budget : {false, true}) {
    PlannerOptions o = planner_options({4}, 3);
    o.parameter_memory_default = budget;
    PlanningResult r = run_planner(g, o);
    const auto& st = r.sharding.strategies;
    ASSERT_EQ(st[2].size(), 1u);  // the tangent is pinned
    RedistributionCache cache(*r.model);
    const int64_t wbytes = g.nodes[0].outputs[0]->bytes();
    double best = INFINITY;
    std::vector<int32_t> c(g.nodes.size(), 0);
    std::function<void(size_t)> walk = [&](size_t i) {
      if (i == c.size()) {
        ChoiceCost cc = evaluate_choice(r.sharding, c, cache, r.lowered.overlap);
        if (!budget || cc.parameter_bytes_per_gpu * 4 <= wbytes) best = std::min(best, cc.total_us);
        return;
      }
      for (c[i] = 0; c[i] < static_cast<int32_t>(st[i].size()); ++c[i]) walk(i + 1);
    };
    walk(0);
    EXPECT_NEAR(r.plan.cost.total_us, best, 1e-9 * best) << "budget " << budget;
    expect_objective_matches_evaluation(r);
    expect_outputs_follow_contract(r);
    // The gradient leaves in the weight's layout; with the budget that is a sharded one.
    const Layout& wl = output_layout(r, "w");
    EXPECT_EQ(r.plan.cost.output_layouts[1], wl);
    if (budget) EXPECT_TRUE(wl[0].is_shard()) << layout_str(wl);
  }
}
