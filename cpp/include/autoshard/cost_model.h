// Cost models: compute roofline per op, collectives per mesh dim, hardware profiles.
// Every constant has its source documented in cpp/src/cost/*.cpp and docs/cost_model.md.
// Times are microseconds, sizes bytes, rates per second.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "autoshard/tensor.h"

namespace autoshard {

struct HardwareProfile {
  std::string name;            // "H100", "H200", "A100", "B200"
  double peak_flops_fp32 = 0;  // FLOP/s used for float32 matmuls (TF32 tensor cores)
  double peak_flops_bf16 = 0;  // FLOP/s, dense, also float16
  double peak_flops_fp64 = 0;
  double peak_flops_fp8 = 0;
  double hbm_bandwidth = 0;      // bytes/s
  double memory_bytes = 0;       // HBM capacity per GPU
  double flop_efficiency = 0.7;  // achievable fraction of peak FLOP/s
  double bandwidth_efficiency = 0.7;
  double kernel_floor_us = 0;  // per-kernel launch/latency floor
  // Interconnect defaults for a node of this GPU.
  int gpus_per_node = 8;
  double intra_node_bandwidth = 0;  // bytes/s per GPU (NVLink), unidirectional
  double intra_node_latency_us = 0;
  double inter_node_bandwidth = 0;  // bytes/s per GPU (network)
  double inter_node_latency_us = 0;

  // --- added by the cost model (defaults keep hand-built profiles working) ---
  // float32 matmuls run on TF32 tensor cores only when the user allows it
  // (torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision("high"));
  // PyTorch's default is "highest", i.e. plain FP32 on CUDA cores.
  bool fp32_matmul_uses_tf32 = true;
  double peak_flops_fp32_cuda_core = 0;  // FLOP/s of non-tensor-core FP32 (0: use peak_flops_fp32)
  // Achievable fraction of the link rates for collectives (NCCL bus bandwidth / wire rate).
  double intra_node_efficiency = 1.0;
  double inter_node_efficiency = 1.0;
  double collective_launch_us = 0;  // fixed cost of one collective call (kernel launch, sync)
  // The collective library runs a reduce-scatter as an all-reduce of the whole buffer, each
  // rank keeping its slice (gloo does): it costs an all-reduce, twice a ring reduce-scatter.
  bool reduce_scatter_via_all_reduce = false;
  // Fraction of the overlappable communication (prefetched parameter gathers, gradient
  // reductions: overlap_model.h) the runtime hides behind compute when there is enough of it:
  // 1 where collectives run on their own stream (NCCL), less where they share the cores that
  // compute (gloo on CPU); 0 charges every collective in full.
  double comm_overlap = 1.0;
};

// Known profiles: throws std::invalid_argument naming the known ones for an unknown name.
// Names are matched case-insensitively against each profile's short name and a few exact
// aliases (e.g. "NVIDIA H100 80GB HBM3", torch.cuda.get_device_name of an H100 SXM). Other
// variants (A100 40GB, H100 PCIe) are different hardware and are rejected, not approximated.
const HardwareProfile& hardware_profile(std::string_view name);
std::vector<std::string> known_hardware();
// Throws std::invalid_argument naming the first field that is negative, NaN or zero where a
// rate is needed (peak bf16, HBM bandwidth, link bandwidths, gpus_per_node).
void validate_hardware_profile(const HardwareProfile& hw);

// Profiles from their file form (a name or an object of fields): io/hardware_json.h.

// Peak FLOP/s the roofline uses for a dtype; 0 for integer and bool dtypes (memory bound).
double peak_flops(const HardwareProfile& hw, DType dtype);

// Roofline: max(flops / (peak(dtype) * eff), bytes / (bw * eff), floor).
// Zero flops and zero bytes (no kernel at all, e.g. a view) cost 0.
double compute_time_us(const HardwareProfile& hw, double flops, double bytes_moved, DType dtype);
// A pure memory-bound kernel (copies, pointwise): max(bytes / (bw * eff), floor).
double memory_time_us(const HardwareProfile& hw, double bytes_moved);

enum class Collective { AllGather, ReduceScatter, AllReduce, AllToAll };
enum class CollectiveAlgorithm { Auto, Ring, Tree };
std::string_view collective_name(Collective kind);                  // "all_gather", ...
std::string_view collective_algorithm_name(CollectiveAlgorithm a);  // "auto", "ring", "tree"

// The link a process group of one mesh dim runs over, derived from the mesh shape assuming a
// row-major rank layout with the innermost mesh dims packed inside a node.
struct MeshDimLink {
  int group_size = 1;     // ranks in the group (the mesh dim's size)
  int nodes = 1;          // distinct nodes the group spans
  double bandwidth = 0;   // bytes/s per rank on the bottleneck link
  double latency_us = 0;  // per step
  // --- added by the cost model ---
  int ranks_per_node = 1;  // group members that share one node
  double launch_us = 0;    // fixed cost per collective call (0 for size-1 groups)
  // Per-step latency of the steps that stay inside a node when the group spans several nodes
  // with several members each (hierarchical rings and trees); 0 = every step costs latency_us.
  double intra_latency_us = 0;
  bool reduce_scatter_via_all_reduce = false;  // HardwareProfile's field of that name
};
std::vector<MeshDimLink> mesh_dim_links(const HardwareProfile& hw, const std::vector<int64_t>& mesh_shape);

// Time of one collective over a mesh dim. `bytes` is the size of the full (unsharded along
// this dim) buffer: the all-gather output, the reduce-scatter input, the all-reduce buffer,
// the all-to-all per-rank buffer. Uneven shards are padded as PyTorch does by the caller.
double collective_time_us(Collective kind, double bytes, const MeshDimLink& link,
                          CollectiveAlgorithm algo = CollectiveAlgorithm::Auto);

// The time and the algorithm Auto picks (Ring on ties), for reports.
struct CollectiveEstimate {
  double us = 0;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::Ring;
};
CollectiveEstimate estimate_collective(Collective kind, double bytes, const MeshDimLink& link,
                                       CollectiveAlgorithm algo = CollectiveAlgorithm::Auto);

// Bytes of the padded buffer a collective moves for a tensor dim of `dim_size` rows split over
// `group_size` ranks with torch.chunk semantics: every shard is padded to ceil(dim_size / n)
// rows, so the buffer holds ceil(dim_size / n) * n rows. Example: 5 rows over 4 ranks -> 8 rows.
int64_t padded_collective_bytes(int64_t dim_size, int64_t group_size, int64_t bytes_per_row);

}  // namespace autoshard
