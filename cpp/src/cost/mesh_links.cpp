// Which links a mesh dim's process groups run over. Ranks are laid out row-major over the mesh
// (torch's init_device_mesh with arange(world).view(shape)), and consecutive ranks share a node
// (gpus_per_node per node), so the innermost mesh dims stay inside a node.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"

namespace autoshard {
namespace {

// Largest mesh we enumerate rank by rank (far above any real cluster).
constexpr int64_t kMaxMeshSize = int64_t{1} << 26;

struct GroupSpan {
  int nodes = 1;
  int min_ranks_per_node = 1;  // the node with the fewest members bounds the NICs in use
};

// The worst group of mesh dim `dim`: most nodes spanned, fewest members on one node.
GroupSpan worst_group_span(const std::vector<int64_t>& shape, size_t dim, int64_t mesh_size, int gpus_per_node) {
  int64_t n = shape[dim];
  int64_t stride = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) stride *= shape[d];
  int64_t outer = mesh_size / (n * stride);
  GroupSpan worst{1, static_cast<int>(std::min<int64_t>(n, gpus_per_node))};
  bool first = true;
  std::map<int64_t, int> members_per_node;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < stride; ++j) {
      members_per_node.clear();
      for (int64_t k = 0; k < n; ++k) ++members_per_node[(o * n * stride + k * stride + j) / gpus_per_node];
      int nodes = static_cast<int>(members_per_node.size());
      int fewest = n > 0 ? static_cast<int>(n) : 1;
      for (const auto& [node, count] : members_per_node) fewest = std::min(fewest, count);
      if (first || nodes > worst.nodes || (nodes == worst.nodes && fewest < worst.min_ranks_per_node)) {
        worst = {nodes, fewest};
        first = false;
      }
    }
  }
  return worst;
}

}  // namespace

std::vector<MeshDimLink> mesh_dim_links(const HardwareProfile& hw, const std::vector<int64_t>& mesh_shape) {
  if (hw.gpus_per_node < 1)
    throw std::invalid_argument("hardware profile '" + hw.name + "': gpus_per_node must be >= 1");
  if (!(hw.intra_node_bandwidth > 0) || !(hw.inter_node_bandwidth > 0))
    throw std::invalid_argument("hardware profile '" + hw.name +
                                "': intra_node_bandwidth and inter_node_bandwidth must be positive");
  int64_t mesh_size = 1;
  for (size_t d = 0; d < mesh_shape.size(); ++d) {
    if (mesh_shape[d] < 1)
      throw std::invalid_argument("mesh shape: dim " + std::to_string(d) + " has size " +
                                  std::to_string(mesh_shape[d]) + "; every mesh dim needs size >= 1");
    mesh_size *= mesh_shape[d];
    if (mesh_size > kMaxMeshSize)
      throw std::invalid_argument("mesh shape: more than " + std::to_string(kMaxMeshSize) + " devices");
  }
  const double nvlink_bw = hw.intra_node_bandwidth * hw.intra_node_efficiency;
  const double network_bw = hw.inter_node_bandwidth * hw.inter_node_efficiency;

  std::vector<MeshDimLink> links;
  links.reserve(mesh_shape.size());
  for (size_t d = 0; d < mesh_shape.size(); ++d) {
    MeshDimLink link;
    link.group_size = static_cast<int>(mesh_shape[d]);
    GroupSpan span = worst_group_span(mesh_shape, d, mesh_size, hw.gpus_per_node);
    link.nodes = span.nodes;
    link.ranks_per_node = span.min_ranks_per_node;
    if (span.nodes <= 1) {
      link.bandwidth = nvlink_bw;
      link.latency_us = hw.intra_node_latency_us;
    } else {
      // A ring crosses each node boundary once per channel; NCCL spreads channels over the
      // node's NICs, so a group with r members per node can use r NICs, and still no more
      // than what its NVLink hops carry.
      link.bandwidth = std::min(nvlink_bw, network_bw * span.min_ranks_per_node);
      link.latency_us = hw.inter_node_latency_us;
      link.intra_latency_us = hw.intra_node_latency_us;
    }
    link.launch_us = link.group_size > 1 ? hw.collective_launch_us : 0;
    link.reduce_scatter_via_all_reduce = hw.reduce_scatter_via_all_reduce;
    links.push_back(link);
  }
  return links;
}

}  // namespace autoshard
