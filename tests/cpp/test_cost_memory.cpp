// Memory model: local shard sizes (torch.chunk semantics), training state, live intervals.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

#include "autoshard/memory_model.h"

using namespace autoshard;

namespace {

// Sizes of torch.chunk(range(n_rows), pieces): ceil-sized chunks, the last ones short or absent.
std::vector<int64_t> chunk_sizes(int64_t rows, int64_t pieces) {
  std::vector<int64_t> out(static_cast<size_t>(pieces), 0);
  int64_t c = rows == 0 ? 0 : (rows + pieces - 1) / pieces;
  for (int64_t i = 0, left = rows; i < pieces; ++i) {
    out[static_cast<size_t>(i)] = std::min(c, left);
    left -= out[static_cast<size_t>(i)];
  }
  return out;
}

ArgValue tensor_arg(int node, int output = 0) {
  ArgValue v;
  v.kind = ArgValue::Kind::Tensor;
  v.tensor = {node, output};
  return v;
}

Node make_node(const std::string& name, NodeRole role, std::vector<ArgValue> args, int n_outputs = 1) {
  Node n;
  n.name = name;
  n.op = role == NodeRole::Compute ? "aten.op.default" : "placeholder";
  n.role = role;
  n.args = std::move(args);
  for (int i = 0; i < n_outputs; ++i) n.outputs.push_back(TensorMeta{{4, 4}, DType::Float32});
  return n;
}

}  // namespace

TEST(CostMemory, ShardCountsFollowTheLayout) {
  std::vector<int64_t> mesh{2, 4};
  EXPECT_EQ(shard_counts({Placement::shard(0), Placement::shard(0)}, mesh, 2), (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(shard_counts({Placement::shard(1), Placement::replicate()}, mesh, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(shard_counts({Placement::partial(), Placement::shard(0)}, mesh, 3), (std::vector<int64_t>{4, 1, 1}));
  EXPECT_EQ(shard_counts({Placement::replicate(), Placement::replicate()}, mesh, 0), (std::vector<int64_t>{}));
  EXPECT_THROW(shard_counts({Placement::shard(0)}, mesh, 2), std::invalid_argument);
  EXPECT_THROW(shard_counts({Placement::shard(2), Placement::replicate()}, mesh, 2), std::invalid_argument);
}

TEST(CostMemory, LocalShardIsTheLargestTorchChunkEvenWhenNested) {
  // Nested splits over two mesh dims (DTensor splits left to right) against torch.chunk twice.
  for (int64_t rows = 0; rows <= 60; ++rows)
    for (int64_t a = 1; a <= 5; ++a)
      for (int64_t b = 1; b <= 5; ++b) {
        int64_t largest = 0;
        for (int64_t outer : chunk_sizes(rows, a))
          for (int64_t inner : chunk_sizes(outer, b)) largest = std::max(largest, inner);
        EXPECT_EQ(local_shard_shape({rows, 3}, {a * b, 1}), (std::vector<int64_t>{largest, 3}))
            << rows << " rows over " << a << "x" << b;
      }
}

TEST(CostMemory, LocalShardBytes) {
  // bf16 [4096, 4096] as S(0) on dp=2, S(1) on tp=4: [2048, 1024] * 2 bytes.
  TensorMeta w{{4096, 4096}, DType::BFloat16};
  EXPECT_EQ(local_shard_bytes(w, {Placement::shard(0), Placement::shard(1)}, {2, 4}), 2048 * 1024 * 2);
  EXPECT_EQ(local_shard_bytes(w, {Placement::replicate(), Placement::partial()}, {2, 4}), 4096 * 4096 * 2);
  // Uneven: 5 rows over 4 -> 2 rows held.
  EXPECT_EQ(local_shard_bytes({5, 10}, DType::Float32, {4, 1}), 2 * 10 * 4);
  // Scalars: one element.
  EXPECT_EQ(local_shard_bytes({}, DType::Float64, {}), 8);
  EXPECT_THROW(local_shard_bytes({5, 10}, DType::Float32, {4}), std::invalid_argument);
  EXPECT_THROW(local_shard_bytes({5, 10}, DType::Float32, {0, 1}), std::invalid_argument);
  EXPECT_THROW(local_shard_bytes({int64_t{1} << 40, int64_t{1} << 40}, DType::Float32, {1, 1}), std::invalid_argument);
}

TEST(CostMemory, AdamMixedPrecisionIsSixteenBytesPerParameter) {
  OptimizerConfig adam;
  adam.fp32_master_weights = true;
  auto t = training_state_bytes(1000000, DType::BFloat16, adam);
  EXPECT_EQ(t.parameters, 2000000);       // bf16 weights
  EXPECT_EQ(t.gradients, 2000000);        // bf16 grads
  EXPECT_EQ(t.optimizer_state, 8000000);  // 2 fp32 moments
  EXPECT_EQ(t.master_weights, 4000000);   // fp32 master copy
  EXPECT_EQ(t.total(), 16000000);
}

TEST(CostMemory, TrainingStateVariants) {
  // fp32 parameters with Adam: 4 + 4 + 8 bytes; an fp32 parameter is its own master copy.
  OptimizerConfig adam;
  adam.fp32_master_weights = true;
  EXPECT_EQ(training_state_bytes(10, DType::Float32, adam).total(), 160);
  // fp32 params, bf16 grads (e.g. reduce in bf16).
  EXPECT_EQ(training_state_bytes(10, DType::Float32, DType::BFloat16, OptimizerConfig{}).gradients, 20);
  OptimizerConfig sgd{OptimizerKind::SGD};
  EXPECT_EQ(training_state_bytes(10, DType::Float32, sgd).total(), 80);
  OptimizerConfig momentum{OptimizerKind::SGDMomentum};
  EXPECT_EQ(training_state_bytes(10, DType::Float32, momentum).optimizer_state, 40);
  OptimizerConfig frozen{OptimizerKind::None};
  frozen.has_gradients = false;
  frozen.fp32_master_weights = true;
  EXPECT_EQ(training_state_bytes(10, DType::BFloat16, frozen).total(), 20);
  OptimizerConfig bf16_moments;
  bf16_moments.state_dtype = DType::BFloat16;
  EXPECT_EQ(training_state_bytes(10, DType::BFloat16, bf16_moments).optimizer_state, 40);
  EXPECT_THROW(training_state_bytes(-1, DType::Float32), std::invalid_argument);
}

TEST(CostMemory, LiveIntervalRule) {
  EXPECT_EQ(live_interval(2, {5, 3}, false, 10), (LiveInterval{2, 6}));
  EXPECT_EQ(live_interval(2, {}, false, 10), (LiveInterval{2, 3}));
  EXPECT_EQ(live_interval(2, {4}, true, 10), (LiveInterval{2, 10}));
  EXPECT_EQ(live_interval(9, {}, true, 10), (LiveInterval{9, 10}));
  EXPECT_THROW(live_interval(3, {2}, false, 10), std::invalid_argument);
  EXPECT_THROW(live_interval(3, {10}, false, 10), std::invalid_argument);
  EXPECT_THROW(live_interval(10, {}, false, 10), std::invalid_argument);
}

TEST(CostMemory, GraphLiveIntervals) {
  // 0 x (input), 1 w (parameter), 2 mm(x, w), 3 relu(mm), 4 cat([relu, x]) with 2 outputs,
  // 5 sum(cat.0); graph outputs: sum and cat.1.
  Graph g;
  g.nodes.push_back(make_node("x", NodeRole::Input, {}));
  g.nodes.push_back(make_node("w", NodeRole::Parameter, {}));
  g.nodes.push_back(make_node("mm", NodeRole::Compute, {tensor_arg(0), tensor_arg(1)}));
  g.nodes.push_back(make_node("relu", NodeRole::Compute, {tensor_arg(2)}));
  ArgValue list;
  list.kind = ArgValue::Kind::List;
  list.list = {tensor_arg(3), tensor_arg(0)};
  g.nodes.push_back(make_node("cat", NodeRole::Compute, {list}, 2));
  Node sum = make_node("sum", NodeRole::Compute, {});
  sum.kwargs.push_back({"input", tensor_arg(4, 0)});
  g.nodes.push_back(sum);
  g.outputs.push_back({{5, 0}, GraphOutput::Role::Output, 0, -1});
  g.outputs.push_back({{4, 1}, GraphOutput::Role::Output, 1, -1});

  auto iv = graph_live_intervals(g);
  ASSERT_EQ(iv.size(), 6u);
  EXPECT_EQ(iv[0][0], (LiveInterval{0, 5}));  // x read by mm (2) and cat (4)
  EXPECT_EQ(iv[1][0], (LiveInterval{0, 6}));  // parameter: whole step
  EXPECT_EQ(iv[2][0], (LiveInterval{2, 4}));
  EXPECT_EQ(iv[3][0], (LiveInterval{3, 5}));
  EXPECT_EQ(iv[4][0], (LiveInterval{4, 6}));  // read by sum through a kwarg
  EXPECT_EQ(iv[4][1], (LiveInterval{4, 6}));  // graph output: to the end
  EXPECT_EQ(iv[5][0], (LiveInterval{5, 6}));

  LiveIntervalOptions raw;
  raw.persistent_state_whole_step = false;
  raw.outputs_live_to_end = false;
  auto iv2 = graph_live_intervals(g, raw);
  EXPECT_EQ(iv2[1][0], (LiveInterval{1, 3}));
  EXPECT_EQ(iv2[4][1], (LiveInterval{4, 5}));

  // A read of a later node's output is an ordering error.
  g.nodes[2].args.push_back(tensor_arg(3));
  EXPECT_THROW(graph_live_intervals(g), std::invalid_argument);
  g.nodes[2].args.pop_back();
  g.nodes[2].args.push_back(tensor_arg(0, 3));  // no such output
  EXPECT_THROW(graph_live_intervals(g), std::invalid_argument);
}

TEST(CostMemory, PeakLiveBytesMatchesBruteForce) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    int steps = 1 + static_cast<int>(rng() % 20);
    int count = static_cast<int>(rng() % 15);
    std::vector<LiveInterval> iv;
    std::vector<int64_t> bytes;
    for (int i = 0; i < count; ++i) {
      int64_t s = rng() % steps;
      int64_t e = s + static_cast<int64_t>(rng() % (steps - s + 1));
      iv.push_back({s, e});
      bytes.push_back(static_cast<int64_t>(rng() % 1000));
    }
    int64_t brute = 0;
    for (int t = 0; t < steps; ++t) {
      int64_t live = 0;
      for (int i = 0; i < count; ++i)
        if (iv[i].start <= t && t < iv[i].end) live += bytes[i];
      brute = std::max(brute, live);
    }
    EXPECT_EQ(peak_live_bytes(iv, bytes), brute);
  }
  EXPECT_THROW(peak_live_bytes({{0, 1}}, {}), std::invalid_argument);
  EXPECT_THROW(peak_live_bytes({{3, 1}}, {5}), std::invalid_argument);
}
