// The step's memory per GPU (step_memory.h) on a hand-counted graph: y = x @ w.T and its
// weight gradient, where every value's life and size can be read off the graph.
#include <gtest/gtest.h>

#include "autoshard/planner.h"
#include "autoshard/recompute.h"
#include "autoshard/step_memory.h"

#include "test_data_paths.h"
#include "test_planner_util.h"
#include "io/graph_json.h"

using namespace autoshard;

namespace {

constexpr int64_t MiB = int64_t{1} << 20;

}  // namespace

// On one GPU nothing moves: w [1024, 512] and x [4096, 512] (float32) are held throughout,
// y [4096, 1024] from the forward's mm to the end (a module output), the tangent gy from the
// backward's start, and gw [1024, 512] at the last step. The transposes view w and x.
TEST(StepMemory, HandCountedLinearOnOneGpu) {
  Graph g = read_graph_file(test_data("linear_fwd_bwd.json"));
  PlanningResult r = run_planner(g, planner_options({1}));
  const StepMemory& m = r.plan.memory;
  EXPECT_EQ(m.parameters, 2 * MiB);
  EXPECT_EQ(m.inputs, 8 * MiB);
  EXPECT_EQ(m.gradients, 2 * MiB);
  EXPECT_EQ(m.optimizer_state, 4 * MiB);  // Adam: two fp32 moments
  EXPECT_EQ(m.saved_activations, 0);      // the backward reads only w and x
  EXPECT_EQ(m.step_peak, (2 + 8 + 16 + 16 + 2) * MiB);
  EXPECT_EQ(m.peak_at, "gw");
  EXPECT_EQ(m.total_peak(), m.step_peak + 4 * MiB);

  PlannerOptions sgd = planner_options({1});
  sgd.optimizer.kind = OptimizerKind::SGD;
  EXPECT_EQ(run_planner(g, sgd).plan.memory.optimizer_state, 0);
}

// Split 4 ways, each GPU holds a quarter of the weight and at least a quarter of the peak (y
// still leaves replicated: the module output's layout).
TEST(StepMemory, FourGpusHoldAQuarterOfTheWeight) {
  Graph g = read_graph_file(test_data("linear_fwd_bwd.json"));
  const StepMemory one = run_planner(g, planner_options({1})).plan.memory;
  const StepMemory four = run_planner(g, planner_options({4})).plan.memory;
  EXPECT_GE(four.step_peak, one.step_peak / 4);
  EXPECT_EQ(four.parameters, one.parameters / 4);  // the default budget shards the weight
}

TEST(StepMemory, UnknownOptimizerIsRefusedByName) {
  EXPECT_NE(error_of([] { parse_optimizer_kind("lion", "options.optimizer"); }).find("unknown optimizer \"lion\""),
            std::string::npos);
}

// Recomputation (recompute.h) on four residual blocks x + relu(x @ w.T), float32 [32, 16]:
// the backward reads each block's relu output (2 KiB); recomputing a block keeps only its
// input, which the block before returns anyway.
TEST(StepMemory, RecomputedBlocksKeepLessAndNeverTheirOutputs) {
  Graph g = read_graph_file(test_data("layers4_fwd_bwd.json"));
  PlanningResult r = run_planner(g, planner_options({1}));
  const StepMemory none = step_memory(r.sharding, r.plan.choice, {});
  const std::vector<char> full3 = recompute_flags(r.sharding, r.plan.choice, {{"layers.3", RecomputeLevel::Full}});
  const StepMemory one = step_memory(r.sharding, r.plan.choice, {}, full3);
  EXPECT_EQ(none.saved_activations - one.saved_activations, 32 * 16 * 4);
  EXPECT_LE(one.step_peak, none.step_peak);
  const Node& add3 = g.nodes[g.index_by_name.at("add_3")];  // read by the head: the block's output
  EXPECT_EQ(add3.module, "layers.3");
  EXPECT_FALSE(full3[g.index_by_name.at("add_3")]);
  EXPECT_TRUE(full3[g.index_by_name.at("relu_3")]);
  EXPECT_TRUE(full3[g.index_by_name.at("mm_3")]);
  EXPECT_FALSE(full3[g.index_by_name.at("relu_2")]);  // another block
  // Selective keeps the matmul; nothing in the backward's own nodes is ever flagged.
  const std::vector<char> sel = recompute_flags(r.sharding, r.plan.choice, {{"layers.3", RecomputeLevel::Selective}});
  EXPECT_FALSE(sel[g.index_by_name.at("mm_3")]);
  EXPECT_TRUE(sel[g.index_by_name.at("relu_3")]);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].phase == Phase::Backward) EXPECT_FALSE(full3[i]) << g.nodes[i].name;
}

// Auto recomputes nothing where the plan fits, the fewest blocks that fit a tighter limit,
// and says so when even every block recomputed does not fit.
TEST(StepMemory, AutoRecomputesOnlyWhatTheLimitNeeds) {
  Graph g = read_graph_file(test_data("layers4_fwd_bwd.json"));
  PlanningResult r = run_planner(g, planner_options({1}));
  RedistributionCache cache(*r.model);
  auto choose = [&](RecomputeMode mode, int64_t limit) {
    return choose_recompute(r.sharding, r.plan.choice, {}, mode, limit, cache, r.lowered.overlap);
  };
  const RecomputeDecision free = choose(RecomputeMode::Auto, 0);
  EXPECT_TRUE(free.fits);
  EXPECT_EQ(free.node_names(g).size(), 0u);
  const RecomputeDecision all = choose(RecomputeMode::Full, 0);
  ASSERT_LT(all.memory.total_peak(), free.memory.total_peak());
  EXPECT_GT(all.added_us, 0);
  // A limit between the two: some blocks, not all, and it fits.
  const int64_t limit = (all.memory.total_peak() + free.memory.total_peak()) / 2;
  const RecomputeDecision some = choose(RecomputeMode::Auto, limit);
  EXPECT_TRUE(some.fits);
  EXPECT_LE(some.memory.total_peak(), limit);
  EXPECT_GT(some.node_names(g).size(), 0u);
  EXPECT_LT(some.node_names(g).size(), all.node_names(g).size());
  EXPECT_EQ(r.plan.recompute.node_names(g).size(), 0u);  // the planner's default limit: the GPU's memory
  const RecomputeDecision tight = choose(RecomputeMode::Auto, 1);
  EXPECT_FALSE(tight.fits);
  EXPECT_EQ(choose(RecomputeMode::Off, 1).node_names(g).size(), 0u);
  EXPECT_NE(error_of([] { parse_recompute_mode("some", "options.recompute"); }).find("unknown recompute mode"),
            std::string::npos);
}

// A forward-only graph keeps nothing for a backward: no mode and no limit recomputes anything.
TEST(StepMemory, ForwardOnlyGraphsRecomputeNothing) {
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  PlanningResult r = run_planner(g, planner_options({1}));
  RedistributionCache cache(*r.model);
  for (RecomputeMode mode : {RecomputeMode::Auto, RecomputeMode::Selective, RecomputeMode::Full}) {
    const RecomputeDecision d = choose_recompute(r.sharding, r.plan.choice, {}, mode, 1, cache, r.lowered.overlap);
    EXPECT_EQ(d.node_names(g).size(), 0u);
    EXPECT_TRUE(d.blocks.empty());
    EXPECT_EQ(d.added_us, 0);
    EXPECT_FALSE(d.fits);  // a 1-byte limit: said, not hidden
  }
}
