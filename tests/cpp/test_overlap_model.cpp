// The exposed-communication model (overlap_model.h): which redistributions count as
// overlappable, the per-pass factors, and that plans are costed with them consistently.
#include <gtest/gtest.h>

#include "autoshard/overlap_model.h"
#include "autoshard/planner.h"
#include "autoshard/rules.h"
#include "autoshard/strategy.h"

#include "test_data_paths.h"
#include "test_planner_util.h"
#include "io/graph_json.h"
#include "io/hardware_json.h"

using namespace autoshard;

namespace {

// mlp2 (x @ w1.t() -> relu -> @ w2.t() -> relu -> sum) with its weights named as two blocks.
Graph two_block_mlp() {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  g.nodes[static_cast<size_t>(g.index_by_name.at("primals_1"))].fqn = "layers.0.weight";
  g.nodes[static_cast<size_t>(g.index_by_name.at("primals_2"))].fqn = "layers.1.weight";
  return g;
}

struct Modelled {
  Graph graph;
  MeshModel mesh;
  ShardingModel sm;
  OverlapModel overlap;
};

Modelled model(Graph graph, const std::string& hardware, int64_t ranks = 4) {
  register_all_rules();
  Mesh m;
  m.shape = {ranks};
  Modelled r{std::move(graph), MeshModel::make(m, hardware_profile_from_text(hardware)), {}, {}};
  r.sm = build_sharding_model(r.graph, r.mesh, enumerate_strategies(r.graph, r.mesh), {});
  RedistributionCache cache(r.mesh);
  r.overlap = model_overlap(r.sm, cache);
  return r;
}

double input_factor(const Modelled& m, const std::string& node, size_t input) {
  return m.overlap.input_factor[static_cast<size_t>(m.graph.index_by_name.at(node))][input];
}

}  // namespace

TEST(OverlapModel, BlocksAreNumberedModulesPlusTheRest) {
  EXPECT_EQ(count_blocks({"layers.0.w", "layers.0.b", "layers.1.w", "embed.weight"}), 3);
  EXPECT_EQ(count_blocks({"model.layers.12.mlp.w", "model.layers.3.attn.w"}), 2);
  EXPECT_EQ(count_blocks({"w1.weight", "w2.weight"}), 1);
  EXPECT_EQ(count_blocks({"params.0"}), 1);  // a ParameterList entry, not a block
  EXPECT_EQ(count_blocks({}), 0);
}

TEST(OverlapModel, WeightGathersAndGradientReductionsAreOverlappableActivationsAreNot) {
  const Modelled m = model(two_block_mlp(), "H100");
  EXPECT_EQ(m.overlap.blocks, 2);
  EXPECT_LT(m.overlap.forward_factor, 1.0);
  EXPECT_LT(m.overlap.backward_factor, 1.0);
  // the first block's gather never hides: with 2 blocks at least half stays exposed
  EXPECT_GE(m.overlap.forward_factor, 0.5);
  EXPECT_GE(m.overlap.backward_factor, 0.5);
  // mm(x, t(w1)): the weight (through its transpose) can be prefetched, the input cannot
  EXPECT_EQ(input_factor(m, "t", 0), m.overlap.forward_factor);
  EXPECT_EQ(input_factor(m, "mm", 1), m.overlap.forward_factor);
  EXPECT_EQ(input_factor(m, "mm", 0), 1.0);
  EXPECT_EQ(input_factor(m, "mm_1", 0), 1.0);  // relu's output: an activation
  // the backward's use of the weight is a re-gather, overlapped with the backward
  EXPECT_EQ(input_factor(m, "mm_2", 1), m.overlap.backward_factor);
  EXPECT_EQ(input_factor(m, "mm_2", 0), 1.0);
  // the loss, a scalar module output: its reduction is waited for after the backward
  for (size_t j = 0; j < m.graph.outputs.size(); ++j)
    EXPECT_EQ(m.overlap.output_factor[j],
              m.graph.outputs[j].role == GraphOutput::Role::Grad ? m.overlap.backward_factor : 0.0);
}

TEST(OverlapModel, TheCountOfTargetsAndTheLossRunBesideTheStep) {
  // cross_entropy(x @ w.t(), target): loss = nll_sum / count, and the backward starts
  // with tangent / count; the runtime all-reduces the count from the targets at the top of
  // the forward and waits for it at the end of the backward, the loss on first use
  const Modelled m = model(read_graph_file(test_data("classifier_ce_fwd_bwd.json")), "H100");
  EXPECT_EQ(input_factor(m, "div", 1), 0.0);    // the forward's loss / count
  EXPECT_EQ(input_factor(m, "div_1", 1), 0.0);  // the backward's tangent / count
  EXPECT_EQ(input_factor(m, "nll_loss_backward", 3), 0.0);
  EXPECT_EQ(input_factor(m, "div", 0), 1.0);  // the loss sum itself: an activation
  EXPECT_EQ(input_factor(m, "mm", 0), 1.0);
  for (size_t j = 0; j < m.graph.outputs.size(); ++j)
    if (m.graph.outputs[j].role == GraphOutput::Role::Output) EXPECT_EQ(m.overlap.output_factor[j], 0.0);
}

TEST(OverlapModel, NoOverlapWhenTheHardwareSaysNoneOrThereIsOneBlockOrOneRank) {
  for (const Modelled& m :
       {model(two_block_mlp(), R"({"base": "H100", "comm_overlap": 0})"),
        model(read_graph_file(test_data("mlp2_fwd_bwd.json")), "H100"), model(two_block_mlp(), "H100", 1)}) {
    EXPECT_EQ(m.overlap.forward_factor, 1.0);
    EXPECT_EQ(m.overlap.backward_factor, 1.0);
    for (const auto& per_node : m.overlap.input_factor)
      for (double f : per_node) EXPECT_EQ(f, 1.0);
  }
}

TEST(OverlapModel, LessOverlapOnHardwareThatHidesLess) {
  const Modelled full = model(two_block_mlp(), "H100");
  const Modelled half = model(two_block_mlp(), R"({"base": "H100", "comm_overlap": 0.5})");
  EXPECT_GT(half.overlap.forward_factor, full.overlap.forward_factor);
  EXPECT_GT(half.overlap.backward_factor, full.overlap.backward_factor);
}

TEST(OverlapModel, PlansAreCostedWithExposedCommunication) {
  const PlanningResult r = run_planner(two_block_mlp(), planner_options({4}, 3));
  const ChoiceCost& c = r.plan.cost;
  EXPECT_LT(c.exposed_comm_us, c.comm_us);  // FSDP-like: the weight gathers hide in part
  EXPECT_GT(c.exposed_comm_us, 0.0);
  EXPECT_NEAR(c.total_us, c.compute_us + c.exposed_comm_us, 1e-9 * c.total_us);
  EXPECT_NEAR(r.plan.solver_objective_us, c.total_us, 1e-9 * c.total_us);
}

TEST(OverlapModel, BucketedCollectivesShareTheirLaunch) {
  // The runtime gathers (and reduces) each block's weights in one call: a single collective
  // of those kinds pays 1/k of a launch, k = weights per block. Two blocks of one weight:
  // k = 1 (also with overlap off: bucketing does not depend on it).
  const Modelled m = model(two_block_mlp(), R"({"base": "CPU", "comm_overlap": 0})");
  const size_t t = static_cast<size_t>(m.graph.index_by_name.at("t"));
  const size_t mm = static_cast<size_t>(m.graph.index_by_name.at("mm"));
  EXPECT_DOUBLE_EQ(m.overlap.launch_us, 150.0);  // the CPU profile's fixed cost per call
  EXPECT_DOUBLE_EQ(m.overlap.input_launch_share[t][0], 1.0);
  EXPECT_DOUBLE_EQ(m.overlap.input_launch_share[mm][0], 1.0);  // an activation: its own call
  for (size_t j = 0; j < m.graph.outputs.size(); ++j)
    if (m.graph.outputs[j].role == GraphOutput::Role::Grad) EXPECT_DOUBLE_EQ(m.overlap.output_launch_share[j], 1.0);
  // one block holding both weights: each call is shared by two
  const Modelled one = model(read_graph_file(test_data("mlp2_fwd_bwd.json")), "CPU");
  EXPECT_DOUBLE_EQ(one.overlap.input_launch_share[t][0], 0.5);
  // charged: a single collective pays its share of the launch, a chain of two pays both
  EXPECT_DOUBLE_EQ(charged_time_us(400, 1, 150, 0.5, 1.0), 325);
  EXPECT_DOUBLE_EQ(charged_time_us(400, 1, 150, 0.5, 0.5), 162.5);
  EXPECT_DOUBLE_EQ(charged_time_us(400, 2, 150, 0.5, 1.0), 400);
  EXPECT_DOUBLE_EQ(charged_time_us(400, 0, 150, 0.5, 1.0), 400);
  EXPECT_GE(charged_time_us(kInfeasibleCost * 2, 1, 150, 0.5, 0.5), kInfeasibleCost);
}
