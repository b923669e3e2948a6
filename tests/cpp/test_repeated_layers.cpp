// Tied repeated layers (repeated_layers.h, PlannerOptions::repeated_layers) against ground
// truth: which layers are found identical, a tied plan priced exactly as the graph prices it,
// never cheaper than the untied optimum (the untied problem is the relaxation), within the
// memory limit when its every layer is checked on its own, and pinned layers left untied.
// The graph: 4 residual blocks x + relu(x W_k) in a ModuleList `layers`, then a head; layer 0
// has no input gradient to compute, so it differs from layers 1-3.
#include <gtest/gtest.h>

#include <algorithm>

#include "autoshard/evaluate.h"
#include "autoshard/planner.h"
#include "autoshard/repeated_layers.h"

#include "test_data_paths.h"
#include "test_planner_util.h"
#include "io/graph_json.h"

using namespace autoshard;

namespace {

Graph layers4() { return read_graph_file(test_data("layers4_fwd_bwd.json")); }

PlannerOptions options(LayerTying tying, double time_limit_s = 5) {
  PlannerOptions o = planner_options({2, 2}, time_limit_s);
  o.repeated_layers = tying;
  o.gap_tolerance = 0;  // proofs of optimality: tied and untied optima are compared
  return o;
}

int32_t node(const Graph& g, const std::string& name) { return g.index_by_name.at(name); }

// The untied problem's memory profile of a plan (one strategy per graph node): what every
// layer on its own holds.
int64_t untied_peak(const PlanningResult& r, int64_t limit) {
  ShardingModel sm = r.sharding;
  untie_layers(sm);
  LoweringOptions lo;
  lo.memory_limit_bytes = limit > 0 ? limit : int64_t{1} << 60;  // a limit makes the usages count
  RedistributionCache cache(*r.model);
  LoweredProblem lp = lower_to_problem(sm, lo, cache);
  Solution s(lp.graph_node.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = r.plan.choice[lp.graph_node[i]];
  const Evaluation ev = evaluate(lp.problem, s);
  EXPECT_TRUE(ev.valid) << ev.violation;
  return ev.peak_usage;
}

}  // namespace

TEST(RepeatedLayers, FindsTheIdenticalLayersAndLeavesTheOddOneOut) {
  const Graph g = layers4();
  const RepeatedLayers t = find_repeated_layers(g, {});
  EXPECT_EQ(t.container, "layers");
  EXPECT_EQ(t.tied, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(t.untied, (std::vector<int64_t>{0}));
  // Forward, backward and the gradient accumulation autograd adds outside any module.
  EXPECT_EQ(t.of(node(g, "mm_2")), node(g, "mm_1"));
  EXPECT_EQ(t.of(node(g, "mm_3")), node(g, "mm_1"));
  EXPECT_EQ(t.of(node(g, "primals_4")), node(g, "primals_2"));
  EXPECT_EQ(t.of(node(g, "add_4")), node(g, "add_6"));  // layer 3's and layer 1's, both module-less
  EXPECT_EQ(t.of(node(g, "mm")), node(g, "mm"));        // layer 0: itself
  EXPECT_EQ(t.of(node(g, "mm_4")), node(g, "mm_4"));    // the head
  // Fewer identical layers than asked for: nothing tied.
  EXPECT_FALSE(find_repeated_layers(g, {}, 4).any());
}

TEST(RepeatedLayers, ExcludedNodesKeepTheirLayerUntied) {
  const Graph g = layers4();
  std::vector<bool> excluded(g.nodes.size(), false);
  excluded[node(g, "relu_2")] = true;
  const RepeatedLayers t = find_repeated_layers(g, excluded);
  EXPECT_EQ(t.tied, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(t.untied, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(t.of(node(g, "mm_2")), node(g, "mm_2"));
}

TEST(RepeatedLayers, TiedPlanIsPricedExactlyAndNeverBeatsTheUntiedOptimum) {
  const Graph g = layers4();
  for (bool budget : {true, false}) {
    PlannerOptions tie = options(LayerTying::Tie), untie = options(LayerTying::Untie);
    tie.parameter_memory_default = untie.parameter_memory_default = budget;
    const PlanningResult t = run_planner(g, tie), u = run_planner(g, untie);
    ASSERT_TRUE(t.sharding.tied.any());
    EXPECT_FALSE(u.sharding.tied.any());
    EXPECT_TRUE(t.plan.proven_optimal && u.plan.proven_optimal);
    // run_planner itself checks the solver's price against the graph's (evaluate_choice).
    EXPECT_NEAR(t.plan.solver_objective_us, t.plan.cost.total_us, 1e-9 * t.plan.cost.total_us);
    EXPECT_GE(t.plan.cost.total_us, u.plan.cost.total_us * (1 - 1e-12));
    EXPECT_LT(t.plan.solver_nodes, u.plan.solver_nodes);
    // Every copy runs its representative's strategy.
    for (size_t i = 0; i < g.nodes.size(); ++i)
      EXPECT_EQ(t.plan.choice[i], t.plan.choice[t.sharding.tied.of(static_cast<int32_t>(i))]) << g.nodes[i].name;
    ASSERT_FALSE(t.plan.notes.empty());
    EXPECT_NE(t.plan.notes.back().find("3 identical layers of 'layers'"), std::string::npos) << t.plan.notes.back();
  }
}

TEST(RepeatedLayers, TiedMemoryIsNeverUnderstated) {
  const Graph g = layers4();
  PlannerOptions o = options(LayerTying::Tie);
  o.parameter_memory_default = false;  // no budget: memory alone decides how much is sharded
  o.parameter_memory.reset();
  o.recompute = RecomputeMode::Off;  // the solver's own limit, not recomputation, meets it
  PlannerOptions free = options(LayerTying::Untie);
  free.parameter_memory_default = false;
  free.parameter_memory.reset();
  const int64_t unlimited = untied_peak(run_planner(g, free), -1);
  int planned = 0;
  for (double share : {0.7, 0.5, 0.35}) {
    const int64_t limit = static_cast<int64_t>(share * static_cast<double>(unlimited));
    o.memory_limit_bytes = limit;
    try {
      const PlanningResult r = run_planner(g, o);
      EXPECT_LE(untied_peak(r, limit), limit) << share;
      ++planned;
    } catch (const InfeasiblePlanError&) {
      // The tied bound may refuse a limit the layers would meet one by one; never the reverse.
    }
  }
  EXPECT_GE(planned, 2);
}

TEST(RepeatedLayers, AutoTiesOnlyLargeProblemsAndPinsUntie) {
  const Graph g = layers4();
  EXPECT_FALSE(run_planner(g, options(LayerTying::Auto)).sharding.tied.any());
  PlannerOptions o = options(LayerTying::Tie);
  o.constraints.nodes["mm_2"] = Layout{Placement::shard(0), Placement::replicate()};
  const PlanningResult r = run_planner(g, o);
  ASSERT_TRUE(r.sharding.tied.any());
  EXPECT_EQ(r.sharding.tied.tied, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r.plan.choice.size(), g.nodes.size());
}
