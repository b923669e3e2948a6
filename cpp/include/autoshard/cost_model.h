// Cost models: compute roofline per op, collectives per mesh dim, hardware profiles.
// Every constant has its source documented in cpp/src/cost/*.cpp. Times are microseconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace autoshard {

enum class DType { Float64, Float32, BFloat16, Float16, Float8, Int64, Int32, Int16, Int8, UInt8, Bool, Complex64 };
DType parse_dtype(std::string_view name);  // "float32", "bfloat16", ...; throws on unknown
std::string_view dtype_name(DType d);
int dtype_bytes(DType d);

struct HardwareProfile {
  std::string name;                // "H100", "H200", "A100", "B200"
  double peak_flops_fp32 = 0;      // FLOP/s used for float32 matmuls (TF32 tensor cores)
  double peak_flops_bf16 = 0;      // FLOP/s, dense, also float16
  double peak_flops_fp64 = 0;
  double peak_flops_fp8 = 0;
  double hbm_bandwidth = 0;        // bytes/s
  double memory_bytes = 0;         // HBM capacity per GPU
  double flop_efficiency = 0.7;    // achievable fraction of peak FLOP/s
  double bandwidth_efficiency = 0.7;
  double kernel_floor_us = 0;      // per-kernel launch/latency floor
  // Interconnect defaults for a node of this GPU.
  int gpus_per_node = 8;
  double intra_node_bandwidth = 0; // bytes/s per GPU (NVLink), unidirectional
  double intra_node_latency_us = 0;
  double inter_node_bandwidth = 0; // bytes/s per GPU (network)
  double inter_node_latency_us = 0;
};

// Known profiles: throws std::invalid_argument naming the known ones for an unknown name.
const HardwareProfile& hardware_profile(std::string_view name);
std::vector<std::string> known_hardware();

// Roofline: max(flops / (peak(dtype) * eff), bytes / (bw * eff), floor).
double compute_time_us(const HardwareProfile& hw, double flops, double bytes_moved, DType dtype);
// A pure memory-bound kernel (copies, pointwise): max(bytes / (bw * eff), floor).
double memory_time_us(const HardwareProfile& hw, double bytes_moved);

enum class Collective { AllGather, ReduceScatter, AllReduce, AllToAll };
enum class CollectiveAlgorithm { Auto, Ring, Tree };

// The link a process group of one mesh dim runs over, derived from the mesh shape assuming a
// row-major rank layout with the innermost mesh dims packed inside a node.
struct MeshDimLink {
  int group_size = 1;      // ranks in the group (the mesh dim's size)
  int nodes = 1;           // distinct nodes the group spans
  double bandwidth = 0;    // bytes/s per rank on the bottleneck link
  double latency_us = 0;   // per step
};
std::vector<MeshDimLink> mesh_dim_links(const HardwareProfile& hw, const std::vector<int64_t>& mesh_shape);

// Time of one collective over a mesh dim. `bytes` is the size of the full (unsharded along
// this dim) buffer: the all-gather output, the reduce-scatter input, the all-reduce buffer,
// the all-to-all per-rank buffer. Uneven shards are padded as PyTorch does by the caller.
double collective_time_us(Collective kind, double bytes, const MeshDimLink& link,
                          CollectiveAlgorithm algo = CollectiveAlgorithm::Auto);

}  // namespace autoshard
