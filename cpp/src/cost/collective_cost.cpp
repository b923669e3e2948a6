// Alpha-beta models of collectives over one process group of n ranks. alpha = per-step
// latency, beta = 1 / (per-rank bandwidth). `bytes` is the full (unsharded along the group's
// mesh dim) buffer, see cost_model.h.
//
// Ring (NCCL's default for large messages):
//   all-gather / reduce-scatter: (n-1) alpha + (n-1)/n bytes beta
//   all-reduce (reduce-scatter + all-gather): 2(n-1) alpha + 2(n-1)/n bytes beta
//   all-to-all (pairwise exchange): (n-1) alpha + (n-1)/n bytes beta
// Tree / logarithmic (L = ceil(log2 n)):
//   all-gather / reduce-scatter (recursive doubling / halving, NCCL's PAT):
//       L alpha + (n-1)/n bytes beta
//   all-reduce (pipelined double binary tree: reduce up, broadcast down): 2 L alpha + 2 bytes beta
//   all-to-all (Bruck: L rounds, each moving half the buffer): L alpha + L/2 bytes beta
// Every call with n > 1 also pays the link's fixed launch cost. A library that runs
// reduce-scatter as an all-reduce (gloo) is charged an all-reduce for it.
//
// Latency steps of a group spanning `nodes` nodes with r members on each (row-major packing,
// so a group's members on one node are consecutive in the ring): a ring crosses the network
// once per node boundary (nodes - 1 of its n - 1 steps, doubled for all-reduce) and pays the
// NVLink latency on the others; a logarithmic algorithm spends log2(r) levels inside nodes and
// log2(nodes) across; pairwise all-to-all has r - 1 in-node peers and n - r remote ones.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"

namespace autoshard {
namespace {

int ceil_log2(int64_t n) {
  int steps = 0;
  for (int64_t reach = 1; reach < n; reach *= 2) ++steps;
  return steps;
}

// Latency steps of one collective, split by the link they cross.
struct Steps {
  double intra = 0;  // steps between members on the same node
  double inter = 0;  // steps that cross the network (or all steps of a flat group)
};

// A group is hierarchical when it spans several nodes with several members on each and the
// link says what an in-node step costs; otherwise every step costs link.latency_us.
bool hierarchical(const MeshDimLink& link) {
  return link.nodes > 1 && link.ranks_per_node > 1 && link.intra_latency_us > 0;
}

Steps ring_steps(Collective kind, const MeshDimLink& link) {
  const double n = link.group_size;
  const double factor = kind == Collective::AllReduce ? 2 : 1;
  if (!hierarchical(link)) return {0, factor * (n - 1)};
  if (kind == Collective::AllToAll)  // pairwise exchange: one step per peer
    return {static_cast<double>(link.ranks_per_node - 1), n - link.ranks_per_node};
  // A ring visits the members of each node consecutively: one network hop per node boundary.
  const double inter = link.nodes - 1;
  return {factor * (n - 1 - inter), factor * inter};
}

Steps tree_steps(Collective kind, const MeshDimLink& link) {
  const double factor = kind == Collective::AllReduce ? 2 : 1;
  if (!hierarchical(link)) return {0, factor * ceil_log2(link.group_size)};
  // Recursive doubling / binary trees over row-major packed members: the first
  // log2(members per node) levels stay inside a node, the rest cross the network.
  return {factor * ceil_log2(link.ranks_per_node), factor * ceil_log2(link.nodes)};
}

double latency_us(const Steps& s, const MeshDimLink& link) {
  return s.intra * link.intra_latency_us + s.inter * link.latency_us;
}

double ring_us(Collective kind, double bytes, const MeshDimLink& link, double beta) {
  const double n = link.group_size;
  const double frac = (n - 1) / n;
  const double data = kind == Collective::AllReduce ? 2 * frac * bytes * beta : frac * bytes * beta;
  return latency_us(ring_steps(kind, link), link) + data;
}

double tree_us(Collective kind, double bytes, const MeshDimLink& link, double beta) {
  const double n = link.group_size;
  double data = 0;
  switch (kind) {
    case Collective::AllGather:
    case Collective::ReduceScatter:
      data = (n - 1) / n * bytes * beta;
      break;
    case Collective::AllReduce:
      data = 2 * bytes * beta;
      break;
    case Collective::AllToAll:
      data = ceil_log2(link.group_size) / 2.0 * bytes * beta;
      break;
  }
  return latency_us(tree_steps(kind, link), link) + data;
}

}  // namespace

std::string_view collective_name(Collective kind) {
  switch (kind) {
    case Collective::AllGather:
      return "all_gather";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllReduce:
      return "all_reduce";
    case Collective::AllToAll:
      return "all_to_all";
  }
  return "unknown";
}

std::string_view collective_algorithm_name(CollectiveAlgorithm a) {
  switch (a) {
    case CollectiveAlgorithm::Auto:
      return "auto";
    case CollectiveAlgorithm::Ring:
      return "ring";
    case CollectiveAlgorithm::Tree:
      return "tree";
  }
  return "unknown";
}

CollectiveEstimate estimate_collective(Collective kind, double bytes, const MeshDimLink& link,
                                       CollectiveAlgorithm algo) {
  if (!std::isfinite(bytes) || bytes < 0)
    throw std::invalid_argument(std::string(collective_name(kind)) +
                                ": bytes must be a finite non-negative number, got " + std::to_string(bytes));
  if (link.group_size < 1)
    throw std::invalid_argument(std::string(collective_name(kind)) + ": group_size must be >= 1, got " +
                                std::to_string(link.group_size));
  if (kind == Collective::ReduceScatter && link.reduce_scatter_via_all_reduce) kind = Collective::AllReduce;
  CollectiveEstimate est;
  est.algorithm = algo == CollectiveAlgorithm::Auto ? CollectiveAlgorithm::Ring : algo;
  if (link.group_size == 1 || bytes == 0) return est;  // nothing leaves the rank
  if (!(link.bandwidth > 0) || !std::isfinite(link.bandwidth))
    throw std::invalid_argument(std::string(collective_name(kind)) + ": link bandwidth must be positive, got " +
                                std::to_string(link.bandwidth));
  if (!std::isfinite(link.latency_us) || link.latency_us < 0 || !std::isfinite(link.launch_us) || link.launch_us < 0)
    throw std::invalid_argument(std::string(collective_name(kind)) + ": link latencies must be >= 0");

  if (!std::isfinite(link.intra_latency_us) || link.intra_latency_us < 0)
    throw std::invalid_argument(std::string(collective_name(kind)) + ": link intra_latency_us must be >= 0");
  if (link.nodes < 1 || link.ranks_per_node < 1)
    throw std::invalid_argument(std::string(collective_name(kind)) + ": link nodes and ranks_per_node must be >= 1");
  double beta = 1e6 / link.bandwidth;  // us per byte
  double ring = ring_us(kind, bytes, link, beta);
  double tree = tree_us(kind, bytes, link, beta);
  switch (algo) {
    case CollectiveAlgorithm::Ring:
      est.us = ring;
      break;
    case CollectiveAlgorithm::Tree:
      est.us = tree;
      break;
    case CollectiveAlgorithm::Auto:
      est.algorithm = tree < ring ? CollectiveAlgorithm::Tree : CollectiveAlgorithm::Ring;
      est.us = std::min(ring, tree);
      break;
  }
  est.us += link.launch_us;
  return est;
}

double collective_time_us(Collective kind, double bytes, const MeshDimLink& link, CollectiveAlgorithm algo) {
  return estimate_collective(kind, bytes, link, algo).us;
}

int64_t padded_collective_bytes(int64_t dim_size, int64_t group_size, int64_t bytes_per_row) {
  if (dim_size < 0 || group_size < 1 || bytes_per_row < 0)
    throw std::invalid_argument(
        "padded_collective_bytes: need dim_size >= 0, group_size >= 1, bytes_per_row >= 0; got " +
        std::to_string(dim_size) + ", " + std::to_string(group_size) + ", " + std::to_string(bytes_per_row));
  int64_t rows_per_shard = dim_size / group_size + (dim_size % group_size != 0 ? 1 : 0);
  if (rows_per_shard > std::numeric_limits<int64_t>::max() / group_size)
    throw std::invalid_argument("padded_collective_bytes: result exceeds 64 bits");
  int64_t rows = rows_per_shard * group_size;
  if (bytes_per_row != 0 && rows > std::numeric_limits<int64_t>::max() / bytes_per_row)
    throw std::invalid_argument("padded_collective_bytes: result exceeds 64 bits");
  return rows * bytes_per_row;
}

}  // namespace autoshard
