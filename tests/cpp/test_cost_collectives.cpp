// Mesh-dim links and alpha-beta collective models, against hand-computed numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <stdexcept>
#include <vector>

#include "autoshard/cost_model.h"

using namespace autoshard;

namespace {

const HardwareProfile& h100() { return hardware_profile("H100"); }
// H100 effective rates: NVLink 450 GB/s * 0.8, NDR 50 GB/s * 0.9.
constexpr double kNvlink = 360e9;
constexpr double kNic = 45e9;

// Brute force: distinct nodes and fewest members per node of every group of mesh dim `dim`,
// listing each group's ranks by unravelling every rank's mesh coordinate.
void brute_force_span(const std::vector<int64_t>& shape, size_t dim, int gpus_per_node, int& worst_nodes,
                      int& worst_min) {
  int64_t size = 1;
  for (auto s : shape) size *= s;
  std::map<std::vector<int64_t>, std::vector<int64_t>> groups;  // coords without `dim` -> ranks
  for (int64_t r = 0; r < size; ++r) {
    std::vector<int64_t> coord(shape.size());
    int64_t rem = r;
    for (size_t d = shape.size(); d-- > 0;) {
      coord[d] = rem % shape[d];
      rem /= shape[d];
    }
    coord[dim] = -1;
    groups[coord].push_back(r);
  }
  worst_nodes = 0;
  worst_min = 1 << 30;
  for (const auto& [key, ranks] : groups) {
    std::map<int64_t, int> per_node;
    for (auto r : ranks) ++per_node[r / gpus_per_node];
    int mn = 1 << 30;
    for (auto& [n, c] : per_node) mn = std::min(mn, c);
    int nodes = static_cast<int>(per_node.size());
    if (nodes > worst_nodes || (nodes == worst_nodes && mn < worst_min)) {
      worst_nodes = nodes;
      worst_min = mn;
    }
  }
}

}  // namespace

TEST(CostMeshLinks, DpByTpOn64Gpus) {
  auto links = mesh_dim_links(h100(), {8, 8});
  ASSERT_EQ(links.size(), 2u);
  // tp (inner, stride 1): one node over NVLink.
  EXPECT_EQ(links[1].group_size, 8);
  EXPECT_EQ(links[1].nodes, 1);
  EXPECT_DOUBLE_EQ(links[1].bandwidth, kNvlink);
  EXPECT_DOUBLE_EQ(links[1].latency_us, 1.0);
  EXPECT_DOUBLE_EQ(links[1].launch_us, 8.0);
  // dp (outer, stride 8): one rank on each of 8 nodes, bound by its NIC.
  EXPECT_EQ(links[0].nodes, 8);
  EXPECT_EQ(links[0].ranks_per_node, 1);
  EXPECT_DOUBLE_EQ(links[0].bandwidth, kNic);
  EXPECT_DOUBLE_EQ(links[0].latency_us, 4.0);
}

TEST(CostMeshLinks, VariousShapes) {
  auto one = mesh_dim_links(h100(), {4});
  EXPECT_EQ(one[0].nodes, 1);
  EXPECT_DOUBLE_EQ(one[0].bandwidth, kNvlink);

  auto two_by_two = mesh_dim_links(h100(), {2, 2});
  EXPECT_EQ(two_by_two[0].nodes, 1);
  EXPECT_EQ(two_by_two[1].nodes, 1);

  auto big = mesh_dim_links(h100(), {32, 8});
  EXPECT_EQ(big[0].nodes, 32);
  EXPECT_DOUBLE_EQ(big[0].bandwidth, kNic);
  EXPECT_EQ(big[1].nodes, 1);

  auto three = mesh_dim_links(h100(), {2, 4, 8});
  EXPECT_EQ(three[2].nodes, 1);
  EXPECT_EQ(three[1].nodes, 4);
  EXPECT_EQ(three[0].nodes, 2);
  EXPECT_DOUBLE_EQ(three[0].bandwidth, kNic);

  // 16 ranks in one dim: 8 per node on 2 nodes; rings spread over 8 NICs (8 * 45 = 360 GB/s),
  // capped by NVLink (360 GB/s).
  auto flat16 = mesh_dim_links(h100(), {16});
  EXPECT_EQ(flat16[0].nodes, 2);
  EXPECT_EQ(flat16[0].ranks_per_node, 8);
  EXPECT_DOUBLE_EQ(flat16[0].bandwidth, std::min(kNvlink, 8 * kNic));
  EXPECT_DOUBLE_EQ(flat16[0].latency_us, 4.0);

  // {4, 4}: the outer dim (stride 4) has 2 members on each of 2 nodes -> 2 NICs.
  auto four = mesh_dim_links(h100(), {4, 4});
  EXPECT_EQ(four[1].nodes, 1);
  EXPECT_EQ(four[0].nodes, 2);
  EXPECT_EQ(four[0].ranks_per_node, 2);
  EXPECT_DOUBLE_EQ(four[0].bandwidth, 2 * kNic);

  // Size-1 dims cost nothing to launch.
  auto with_one = mesh_dim_links(h100(), {1, 8});
  EXPECT_EQ(with_one[0].group_size, 1);
  EXPECT_DOUBLE_EQ(with_one[0].launch_us, 0.0);
}

TEST(CostMeshLinks, MatchesBruteForceOnAwkwardShapes) {
  HardwareProfile hw = h100();
  for (int gpn : {1, 2, 4, 8}) {
    hw.gpus_per_node = gpn;
    for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{
             {3, 5}, {6, 4}, {2, 3, 4}, {5}, {12}, {4, 2, 2, 2}, {7, 3}, {1, 1}, {16, 2}}) {
      auto links = mesh_dim_links(hw, shape);
      for (size_t d = 0; d < shape.size(); ++d) {
        int nodes, mn;
        brute_force_span(shape, d, gpn, nodes, mn);
        EXPECT_EQ(links[d].nodes, nodes) << "gpn " << gpn << " dim " << d;
        EXPECT_EQ(links[d].ranks_per_node, mn) << "gpn " << gpn << " dim " << d;
      }
    }
  }
}

TEST(CostMeshLinks, RejectsBadShapes) {
  EXPECT_THROW(mesh_dim_links(h100(), {8, 0}), std::invalid_argument);
  EXPECT_THROW(mesh_dim_links(h100(), {-2}), std::invalid_argument);
  HardwareProfile hw = h100();
  hw.gpus_per_node = 0;
  EXPECT_THROW(mesh_dim_links(hw, {8}), std::invalid_argument);
  EXPECT_TRUE(mesh_dim_links(h100(), {}).empty());
}

TEST(CostCollectives, OneGigabyteAllReduceInNode) {
  auto link = mesh_dim_links(h100(), {8})[0];
  double bytes = 1e9;                                                         // 250M fp32 values
  double expected = 2.0 * 7 / 8 * bytes / kNvlink * 1e6 + 2 * 7 * 1.0 + 8.0;  // 4861.1 + 14 + 8 us
  EXPECT_NEAR(collective_time_us(Collective::AllReduce, bytes, link, CollectiveAlgorithm::Ring), expected, 1e-6);
  EXPECT_NEAR(expected, 4883.11, 0.01);
  // Auto picks ring here: tree would move 2 * bytes.
  auto est = estimate_collective(Collective::AllReduce, bytes, link);
  EXPECT_EQ(est.algorithm, CollectiveAlgorithm::Ring);
  EXPECT_NEAR(est.us, expected, 1e-6);
}

TEST(CostCollectives, RingFormulas) {
  MeshDimLink link;
  link.group_size = 4;
  link.bandwidth = 100e9;
  link.latency_us = 2;
  link.launch_us = 10;
  double b = 4e8;  // 4000 us at full rate
  EXPECT_NEAR(collective_time_us(Collective::AllGather, b, link, CollectiveAlgorithm::Ring), 3 * 2 + 3000 + 10, 1e-9);
  EXPECT_NEAR(collective_time_us(Collective::ReduceScatter, b, link, CollectiveAlgorithm::Ring), 3 * 2 + 3000 + 10,
              1e-9);
  EXPECT_NEAR(collective_time_us(Collective::AllReduce, b, link, CollectiveAlgorithm::Ring), 6 * 2 + 6000 + 10, 1e-9);
  EXPECT_NEAR(collective_time_us(Collective::AllToAll, b, link, CollectiveAlgorithm::Ring), 3 * 2 + 3000 + 10, 1e-9);
  // Tree: log2(4) = 2 steps.
  EXPECT_NEAR(collective_time_us(Collective::AllGather, b, link, CollectiveAlgorithm::Tree), 2 * 2 + 3000 + 10, 1e-9);
  EXPECT_NEAR(collective_time_us(Collective::AllReduce, b, link, CollectiveAlgorithm::Tree), 4 * 2 + 8000 + 10, 1e-9);
  EXPECT_NEAR(collective_time_us(Collective::AllToAll, b, link, CollectiveAlgorithm::Tree), 2 * 2 + 4000 + 10, 1e-9);
  // Non power of two: ceil(log2 6) = 3 steps.
  link.group_size = 6;
  EXPECT_NEAR(collective_time_us(Collective::AllGather, b, link, CollectiveAlgorithm::Tree),
              3 * 2 + 5.0 / 6 * 4000 + 10, 1e-9);
}

TEST(CostCollectives, ReduceScatterRunAsAllReduceCostsAnAllReduce) {
  // gloo runs a reduce-scatter as an all-reduce of the whole buffer (the CPU profile says so)
  const HardwareProfile& cpu = hardware_profile("CPU");
  ASSERT_TRUE(cpu.reduce_scatter_via_all_reduce);
  auto link = mesh_dim_links(cpu, {4})[0];
  EXPECT_TRUE(link.reduce_scatter_via_all_reduce);
  for (double b : {1e3, 1e8})
    EXPECT_DOUBLE_EQ(collective_time_us(Collective::ReduceScatter, b, link),
                     collective_time_us(Collective::AllReduce, b, link));
  // NCCL profiles keep the ring reduce-scatter, half an all-reduce's data
  auto nccl = mesh_dim_links(h100(), {4})[0];
  EXPECT_FALSE(nccl.reduce_scatter_via_all_reduce);
  EXPECT_LT(collective_time_us(Collective::ReduceScatter, 1e8, nccl),
            0.6 * collective_time_us(Collective::AllReduce, 1e8, nccl));
}

TEST(CostCollectives, HierarchicalGroupsPayNetworkLatencyOnlyAtNodeBoundaries) {
  // {16}: 8 members on each of 2 nodes. Ring: 15 steps, 1 crosses the network.
  auto flat16 = mesh_dim_links(h100(), {16})[0];
  ASSERT_DOUBLE_EQ(flat16.intra_latency_us, 1.0);
  double b = 3.6e8;  // 1000 us at 360 GB/s
  EXPECT_NEAR(collective_time_us(Collective::AllGather, b, flat16, CollectiveAlgorithm::Ring),
              14 * 1.0 + 1 * 4.0 + 15.0 / 16 * 1000 + 8, 1e-9);
  EXPECT_NEAR(collective_time_us(Collective::AllReduce, b, flat16, CollectiveAlgorithm::Ring),
              2 * (14 * 1.0 + 4.0) + 2 * 15.0 / 16 * 1000 + 8, 1e-9);
  // Pairwise all-to-all: 7 peers on the node, 8 on the other.
  EXPECT_NEAR(collective_time_us(Collective::AllToAll, b, flat16, CollectiveAlgorithm::Ring),
              7 * 1.0 + 8 * 4.0 + 15.0 / 16 * 1000 + 8, 1e-9);
  // Recursive doubling: log2(8) = 3 levels in the node, 1 across.
  EXPECT_NEAR(collective_time_us(Collective::ReduceScatter, b, flat16, CollectiveAlgorithm::Tree),
              3 * 1.0 + 1 * 4.0 + 15.0 / 16 * 1000 + 8, 1e-9);
  EXPECT_NEAR(collective_time_us(Collective::AllReduce, b, flat16, CollectiveAlgorithm::Tree),
              2 * (3 * 1.0 + 4.0) + 2 * 1000 + 8, 1e-9);

  // {4, 4} outer dim: 2 members on each of 2 nodes, 90 GB/s.
  auto outer = mesh_dim_links(h100(), {4, 4})[0];
  double b2 = 9e7;  // 1000 us at 90 GB/s
  EXPECT_NEAR(collective_time_us(Collective::AllGather, b2, outer, CollectiveAlgorithm::Ring),
              2 * 1.0 + 1 * 4.0 + 0.75 * 1000 + 8, 1e-9);
  EXPECT_NEAR(collective_time_us(Collective::AllGather, b2, outer, CollectiveAlgorithm::Tree),
              1 * 1.0 + 1 * 4.0 + 0.75 * 1000 + 8, 1e-9);

  // One member per node (dp of {8, 8}): every step crosses the network.
  auto dp = mesh_dim_links(h100(), {8, 8})[0];
  EXPECT_NEAR(collective_time_us(Collective::AllGather, 4.5e7, dp, CollectiveAlgorithm::Ring),
              7 * 4.0 + 7.0 / 8 * 1000 + 8, 1e-9);

  // A hand-built link without an in-node latency is flat: every step costs latency_us.
  MeshDimLink hand = flat16;
  hand.intra_latency_us = 0;
  EXPECT_NEAR(collective_time_us(Collective::AllGather, b, hand, CollectiveAlgorithm::Ring),
              15 * 4.0 + 15.0 / 16 * 1000 + 8, 1e-9);
}

TEST(CostCollectives, SpanningTwoNodesIsSlowerThanInsideOne) {
  auto inside = mesh_dim_links(h100(), {2})[0];     // 2 GPUs on one node
  auto across = mesh_dim_links(h100(), {2, 8})[0];  // 2 GPUs on 2 nodes
  ASSERT_EQ(inside.nodes, 1);
  ASSERT_EQ(across.nodes, 2);
  auto inside8 = mesh_dim_links(h100(), {8})[0];
  auto across16 = mesh_dim_links(h100(), {16})[0];
  for (auto kind : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce, Collective::AllToAll})
    for (double bytes : {1e3, 1e6, 1e8, 1e10}) {
      EXPECT_GT(collective_time_us(kind, bytes, across), collective_time_us(kind, bytes, inside))
          << collective_name(kind) << " " << bytes;
      EXPECT_GT(collective_time_us(kind, bytes, across16), collective_time_us(kind, bytes, inside8))
          << collective_name(kind) << " " << bytes;
    }
}

TEST(CostCollectives, TreeWinsSmallMessagesOnManyNodesRingWinsLarge) {
  auto dp = mesh_dim_links(h100(), {32, 8})[0];  // 32 nodes, one rank each
  ASSERT_EQ(dp.nodes, 32);
  // ring = 62 a + 2*31/32 B/bw, tree = 10 a + 2 B/bw: equal at B = 52 a * bw * 16 = 832 a bw.
  double crossover = 832 * dp.latency_us * 1e-6 * dp.bandwidth;  // 149.76 MB
  EXPECT_NEAR(crossover, 149.76e6, 1);
  auto small = estimate_collective(Collective::AllReduce, 1e4, dp);
  EXPECT_EQ(small.algorithm, CollectiveAlgorithm::Tree);
  auto below = estimate_collective(Collective::AllReduce, crossover * 0.99, dp);
  EXPECT_EQ(below.algorithm, CollectiveAlgorithm::Tree);
  auto above = estimate_collective(Collective::AllReduce, crossover * 1.01, dp);
  EXPECT_EQ(above.algorithm, CollectiveAlgorithm::Ring);
  double ring_small = collective_time_us(Collective::AllReduce, 1e4, dp, CollectiveAlgorithm::Ring);
  double tree_small = collective_time_us(Collective::AllReduce, 1e4, dp, CollectiveAlgorithm::Tree);
  EXPECT_LT(tree_small, ring_small);
  EXPECT_DOUBLE_EQ(small.us, tree_small);
}

TEST(CostCollectives, GroupOfOneAndZeroBytesCostNothing) {
  MeshDimLink solo;  // group_size 1
  solo.bandwidth = 1e9;
  solo.launch_us = 10;  // even with a launch cost set, nothing is launched
  for (auto kind : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce, Collective::AllToAll})
    for (auto algo : {CollectiveAlgorithm::Auto, CollectiveAlgorithm::Ring, CollectiveAlgorithm::Tree}) {
      EXPECT_EQ(collective_time_us(kind, 1e9, solo, algo), 0.0);
      EXPECT_EQ(collective_time_us(kind, 0, mesh_dim_links(h100(), {8})[0], algo), 0.0);
    }
  EXPECT_EQ(collective_time_us(Collective::AllReduce, 1e9, mesh_dim_links(h100(), {1, 8})[0]), 0.0);
}

TEST(CostCollectives, MonotonicInBytes) {
  std::vector<MeshDimLink> links = mesh_dim_links(h100(), {2, 4, 8});
  for (auto l : mesh_dim_links(hardware_profile("A100"), {32, 8})) links.push_back(l);
  for (const auto& link : links)
    for (auto kind : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce, Collective::AllToAll})
      for (auto algo : {CollectiveAlgorithm::Auto, CollectiveAlgorithm::Ring, CollectiveAlgorithm::Tree}) {
        double prev = 0;
        for (double b = 1; b < 1e11; b *= 1.9) {
          double t = collective_time_us(kind, b, link, algo);
          EXPECT_GT(t, prev);
          prev = t;
        }
      }
}

TEST(CostCollectives, RejectsBadInput) {
  auto link = mesh_dim_links(h100(), {8})[0];
  EXPECT_THROW(collective_time_us(Collective::AllGather, -1, link), std::invalid_argument);
  EXPECT_THROW(collective_time_us(Collective::AllGather, NAN, link), std::invalid_argument);
  link.bandwidth = 0;
  EXPECT_THROW(collective_time_us(Collective::AllGather, 1e6, link), std::invalid_argument);
  MeshDimLink bad;
  bad.group_size = 0;
  EXPECT_THROW(collective_time_us(Collective::AllGather, 1e6, bad), std::invalid_argument);
}

TEST(CostCollectives, UnevenShardsArePaddedLikeTorchChunk) {
  // 5 rows over 4 ranks: chunks of ceil(5/4) = 2 rows -> the padded buffer holds 8 rows.
  EXPECT_EQ(padded_collective_bytes(5, 4, 10), 80);
  EXPECT_EQ(padded_collective_bytes(8, 4, 10), 80);
  EXPECT_EQ(padded_collective_bytes(1, 8, 3), 24);
  EXPECT_EQ(padded_collective_bytes(0, 8, 3), 0);
  EXPECT_EQ(padded_collective_bytes(4097, 8, 2), 8 * 513 * 2);
  // Brute force: the largest torch.chunk piece times the group size.
  for (int64_t n = 1; n <= 9; ++n)
    for (int64_t rows = 0; rows <= 40; ++rows) {
      int64_t largest = 0;
      int64_t chunk = rows == 0 ? 0 : (rows + n - 1) / n;
      for (int64_t i = 0, left = rows; i < n; ++i) {
        int64_t piece = std::min(chunk, left);
        largest = std::max(largest, piece);
        left -= piece;
      }
      EXPECT_EQ(padded_collective_bytes(rows, n, 7), largest * n * 7) << rows << " over " << n;
    }
  EXPECT_THROW(padded_collective_bytes(5, 0, 1), std::invalid_argument);
  EXPECT_THROW(padded_collective_bytes(-1, 2, 1), std::invalid_argument);
  EXPECT_THROW(padded_collective_bytes(int64_t{1} << 62, 3, 8), std::invalid_argument);
}

TEST(CostCollectives, Names) {
  EXPECT_EQ(collective_name(Collective::ReduceScatter), "reduce_scatter");
  EXPECT_EQ(collective_algorithm_name(CollectiveAlgorithm::Tree), "tree");
}
