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
// Every call with n > 1 also pays the link's fixed launch cost.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"

namespace autoshard {
namespace {

int ceil_log2(int n) {
  int steps = 0;
  for (int64_t reach = 1; reach < n; reach *= 2) ++steps;
  return steps;
}

double ring_us(Collective kind, double bytes, double n, double alpha, double beta) {
  double frac = (n - 1) / n;
  switch (kind) {
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
      return (n - 1) * alpha + frac * bytes * beta;
    case Collective::AllReduce:
      return 2 * (n - 1) * alpha + 2 * frac * bytes * beta;
  }
  throw std::invalid_argument("unknown collective kind");
}

double tree_us(Collective kind, double bytes, double n, double alpha, double beta) {
  double steps = ceil_log2(static_cast<int>(n));
  switch (kind) {
    case Collective::AllGather:
    case Collective::ReduceScatter:
      return steps * alpha + (n - 1) / n * bytes * beta;
    case Collective::AllReduce:
      return 2 * steps * alpha + 2 * bytes * beta;
    case Collective::AllToAll:
      return steps * alpha + steps / 2 * bytes * beta;
  }
  throw std::invalid_argument("unknown collective kind");
}

}  // namespace

std::string_view collective_name(Collective kind) {
  switch (kind) {
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllToAll: return "all_to_all";
  }
  return "unknown";
}

std::string_view collective_algorithm_name(CollectiveAlgorithm a) {
  switch (a) {
    case CollectiveAlgorithm::Auto: return "auto";
    case CollectiveAlgorithm::Ring: return "ring";
    case CollectiveAlgorithm::Tree: return "tree";
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
  CollectiveEstimate est;
  est.algorithm = algo == CollectiveAlgorithm::Auto ? CollectiveAlgorithm::Ring : algo;
  if (link.group_size == 1 || bytes == 0) return est;  // nothing leaves the rank
  if (!(link.bandwidth > 0) || !std::isfinite(link.bandwidth))
    throw std::invalid_argument(std::string(collective_name(kind)) + ": link bandwidth must be positive, got " +
                                std::to_string(link.bandwidth));
  if (!std::isfinite(link.latency_us) || link.latency_us < 0 || !std::isfinite(link.launch_us) || link.launch_us < 0)
    throw std::invalid_argument(std::string(collective_name(kind)) + ": link latencies must be >= 0");

  double n = link.group_size;
  double beta = 1e6 / link.bandwidth;  // us per byte
  double ring = ring_us(kind, bytes, n, link.latency_us, beta);
  double tree = tree_us(kind, bytes, n, link.latency_us, beta);
  switch (algo) {
    case CollectiveAlgorithm::Ring: est.us = ring; break;
    case CollectiveAlgorithm::Tree: est.us = tree; break;
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
    throw std::invalid_argument("padded_collective_bytes: need dim_size >= 0, group_size >= 1, bytes_per_row >= 0; got " +
                                std::to_string(dim_size) + ", " + std::to_string(group_size) + ", " +
                                std::to_string(bytes_per_row));
  int64_t rows_per_shard = dim_size / group_size + (dim_size % group_size != 0 ? 1 : 0);
  if (rows_per_shard > std::numeric_limits<int64_t>::max() / group_size)
    throw std::invalid_argument("padded_collective_bytes: result exceeds 64 bits");
  int64_t rows = rows_per_shard * group_size;
  if (bytes_per_row != 0 && rows > std::numeric_limits<int64_t>::max() / bytes_per_row)
    throw std::invalid_argument("padded_collective_bytes: result exceeds 64 bits");
  return rows * bytes_per_row;
}

}  // namespace autoshard
