// The step's memory per GPU (step_memory.h) on a hand-counted graph: y = x @ w.T and its
// weight gradient, where every value's life and size can be read off the graph.
#include <gtest/gtest.h>

#include "autoshard/planner.h"
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
