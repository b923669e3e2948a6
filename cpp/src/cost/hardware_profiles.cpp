// Hardware profiles of 8-GPU HGX/DGX nodes. Peak rates are NVIDIA datasheet numbers; the
// datasheets quote tensor-core rates "with sparsity", so every dense rate below is half the
// datasheet figure. Efficiencies and latencies are engineering estimates (see each comment and
// docs/cost_model.md); bench/calibrate_compute.py compares them with a local GPU.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"

namespace autoshard {
namespace {

// Shared estimates (not from a datasheet):
// - 70% of dense peak FLOP/s: large bf16 GEMMs in cuBLAS reach roughly 65-80% of the dense
//   peak on A100/H100; 0.7 is also the value AutoParallel and many MFU estimates use.
constexpr double kFlopEfficiency = 0.7;
// - 80% of HBM bandwidth: streaming copies reach ~85-90% of the datasheet HBM rate, eager
//   pointwise kernels somewhat less.
constexpr double kBandwidthEfficiency = 0.8;
// - 5 us per kernel: eager PyTorch launches cost a few microseconds each (CPU dispatch +
//   cudaLaunchKernel + the smallest kernel's runtime), so tiny ops do not get cheaper by sharding.
constexpr double kKernelFloorUs = 5.0;
// - NCCL reaches ~80% of the NVLink wire rate as bus bandwidth (nccl-tests all_reduce busbw on
//   8-GPU NVSwitch nodes without NVLS) and ~90% of an InfiniBand NIC's rate.
constexpr double kNvlinkEfficiency = 0.8;
constexpr double kNetworkEfficiency = 0.9;
// - Per-step latencies: NCCL's own tuning model charges ~0.6 us (LL) to ~3.4 us (Simple) per
//   NVLink hop and ~2.7 us (LL) to ~14 us (Simple) per network hop; small messages, where
//   latency matters, use the LL protocols, so we take 1 us and 4 us.
constexpr double kNvlinkStepLatencyUs = 1.0;
constexpr double kNetworkStepLatencyUs = 4.0;
// - Fixed cost of one collective call: NCCL's base latency (~6.6-8.4 us in its tuning model)
//   plus the kernel launch.
constexpr double kCollectiveLaunchUs = 8.0;

HardwareProfile with_shared_estimates(HardwareProfile p) {
  p.flop_efficiency = kFlopEfficiency;
  p.bandwidth_efficiency = kBandwidthEfficiency;
  p.kernel_floor_us = kKernelFloorUs;
  p.gpus_per_node = 8;  // HGX / DGX baseboards: 8 GPUs on NVSwitch
  p.intra_node_latency_us = kNvlinkStepLatencyUs;
  p.inter_node_latency_us = kNetworkStepLatencyUs;
  p.intra_node_efficiency = kNvlinkEfficiency;
  p.inter_node_efficiency = kNetworkEfficiency;
  p.collective_launch_us = kCollectiveLaunchUs;
  p.fp32_matmul_uses_tf32 = true;
  return p;
}

HardwareProfile a100() {
  // NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column.
  HardwareProfile p;
  p.name = "A100";
  p.peak_flops_fp32 = 156e12;             // TF32 tensor core 312 TFLOPS sparse -> 156 dense
  p.peak_flops_fp32_cuda_core = 19.5e12;  // FP32 19.5 TFLOPS
  p.peak_flops_bf16 = 312e12;             // BF16/FP16 tensor core 624 sparse -> 312 dense
  p.peak_flops_fp64 = 19.5e12;            // FP64 tensor core 19.5 TFLOPS
  p.peak_flops_fp8 = 0;                   // Ampere has no FP8 tensor cores (bf16 rate is used)
  p.hbm_bandwidth = 2039e9;               // HBM2e 2,039 GB/s
  p.memory_bytes = 80e9;                  // 80 GB
  p.intra_node_bandwidth = 300e9;         // NVLink 3: 600 GB/s bidirectional -> 300 GB/s each way
  p.inter_node_bandwidth = 25e9;          // DGX A100: one 200 Gb/s HDR InfiniBand NIC per GPU
  return with_shared_estimates(p);
}

HardwareProfile h100() {
  // NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column.
  HardwareProfile p;
  p.name = "H100";
  p.peak_flops_fp32 = 494.5e12;         // TF32 tensor core 989 TFLOPS sparse -> 494.5 dense
  p.peak_flops_fp32_cuda_core = 67e12;  // FP32 67 TFLOPS
  p.peak_flops_bf16 = 989.5e12;         // BF16 tensor core 1,979 sparse -> 989.5 dense
  p.peak_flops_fp64 = 67e12;            // FP64 tensor core 67 TFLOPS
  p.peak_flops_fp8 = 1979e12;           // FP8 tensor core 3,958 sparse -> 1,979 dense
  p.hbm_bandwidth = 3.35e12;            // HBM3 3.35 TB/s
  p.memory_bytes = 80e9;                // 80 GB
  p.intra_node_bandwidth = 450e9;       // NVLink 4: 900 GB/s bidirectional -> 450 GB/s each way
  p.inter_node_bandwidth = 50e9;        // DGX H100: one 400 Gb/s NDR InfiniBand NIC per GPU
  return with_shared_estimates(p);
}

HardwareProfile h200() {
  // NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: same Hopper compute as H100 SXM,
  // larger and faster HBM3e.
  HardwareProfile p = h100();
  p.name = "H200";
  p.hbm_bandwidth = 4.8e12;  // HBM3e 4.8 TB/s
  p.memory_bytes = 141e9;    // 141 GB
  // NVLink 4 (900 GB/s bidirectional) and DGX H200's 400 Gb/s NDR per GPU: as H100.
  return p;
}

HardwareProfile b200() {
  // NVIDIA HGX B200 / DGX B200 datasheets (8-GPU totals, sparse tensor rates) divided by 8 GPUs
  // and by 2 for dense.
  HardwareProfile p;
  p.name = "B200";
  p.peak_flops_fp32 = 1.125e15;         // TF32 18 PFLOPS sparse / 8 GPUs / 2
  p.peak_flops_fp32_cuda_core = 75e12;  // not in the datasheet; ~75-80 TFLOPS published per GPU
  p.peak_flops_bf16 = 2.25e15;          // BF16/FP16 36 PFLOPS sparse / 8 / 2
  p.peak_flops_fp64 = 37e12;            // FP64/FP64 tensor core 296 TFLOPS / 8
  p.peak_flops_fp8 = 4.5e15;            // FP8 72 PFLOPS sparse / 8 / 2
  p.hbm_bandwidth = 8e12;               // 64 TB/s HBM3e / 8 GPUs
  p.memory_bytes = 180e9;               // 1,440 GB / 8 GPUs (DGX B200)
  p.intra_node_bandwidth = 900e9;       // NVLink 5: 1.8 TB/s bidirectional -> 900 GB/s each way
  p.inter_node_bandwidth = 50e9;        // DGX B200: one 400 Gb/s ConnectX-7 NIC per GPU
  return with_shared_estimates(p);
}

HardwareProfile cpu_gloo() {
  // One CPU core per rank running eager PyTorch, all ranks on one host, gloo over loopback TCP:
  // what `torchrun` + gloo on a workstation or CI machine runs. Not a datasheet: measured on
  // an x86-64 cloud host (2026-11, one thread per rank): 512^3 fp32 matmul ~80 GFLOP/s, a
  // streaming multiply ~13 GB/s, gloo all-gather/all-reduce ~0.5-1 GB/s and ~200 us for the
  // smallest message between 2 ranks. The numbers only need to rank plans as this machine
  // does (e.g. data parallelism over replicated compute), not to predict times exactly.
  HardwareProfile p;
  p.name = "CPU";
  p.peak_flops_fp32 = 100e9;
  p.peak_flops_fp32_cuda_core = 100e9;
  p.peak_flops_bf16 = 50e9;  // no bf16 matrix units assumed: slower than fp32
  p.peak_flops_fp64 = 50e9;
  p.peak_flops_fp8 = 0;
  p.hbm_bandwidth = 16e9;  // DRAM share of one core
  p.memory_bytes = 16e9;
  p.flop_efficiency = 0.8;
  p.bandwidth_efficiency = 0.8;
  p.kernel_floor_us = 5.0;  // eager ATen op dispatch on CPU
  p.gpus_per_node = 1024;   // every rank on one host: one link class
  p.intra_node_bandwidth = 1e9;
  p.intra_node_latency_us = 50.0;
  p.intra_node_efficiency = 0.8;
  p.inter_node_bandwidth = 1e9;
  p.inter_node_latency_us = 50.0;
  p.inter_node_efficiency = 0.8;
  p.collective_launch_us = 150.0;          // gloo's fixed cost per call (~200 us measured, 2 ranks)
  p.reduce_scatter_via_all_reduce = true;  // gloo: profiler shows gloo:all_reduce per reduce-scatter
  // gloo's thread copies and sends on the cores the ranks compute on: the profiler showed
  // about half of DDP's all-reduce time hidden behind its backward (2 ranks, 2 cores)
  p.comm_overlap = 0.5;
  p.fp32_matmul_uses_tf32 = false;
  return p;
}

struct NamedProfile {
  HardwareProfile profile;
  std::vector<std::string> aliases;  // lower case, exact match
};

const std::vector<NamedProfile>& registry() {
  static const std::vector<NamedProfile> profiles = [] {
    std::vector<NamedProfile> v;
    v.push_back({a100(), {"a100", "a100 sxm", "a100-sxm4-80gb", "nvidia a100-sxm4-80gb", "a100 80gb"}});
    v.push_back({h100(), {"h100", "h100 sxm", "h100-sxm", "h100 sxm5", "nvidia h100 80gb hbm3"}});
    v.push_back({h200(), {"h200", "h200 sxm", "h200-sxm", "nvidia h200"}});
    v.push_back({b200(), {"b200", "nvidia b200", "hgx b200", "dgx b200"}});
    v.push_back({cpu_gloo(), {"cpu", "cpu-gloo", "gloo"}});
    return v;
  }();
  return profiles;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Trim surrounding spaces so " H100 " from a config file still matches.
  auto b = out.find_first_not_of(' ');
  auto e = out.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : out.substr(b, e - b + 1);
}

void require(bool ok, const HardwareProfile& hw, const char* field, const char* what) {
  if (!ok) throw std::invalid_argument("hardware profile '" + hw.name + "': field " + field + " " + what);
}

}  // namespace

const HardwareProfile& hardware_profile(std::string_view name) {
  std::string key = lower(name);
  for (const auto& np : registry())
    for (const auto& alias : np.aliases)
      if (alias == key) return np.profile;
  std::string known;
  for (const auto& n : known_hardware()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown hardware '" + std::string(name) + "'; known profiles: " + known +
                              " (or build a HardwareProfile with your own numbers)");
}

std::vector<std::string> known_hardware() {
  std::vector<std::string> names;
  for (const auto& np : registry()) names.push_back(np.profile.name);
  return names;
}

void validate_hardware_profile(const HardwareProfile& hw) {
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  auto positive = [](double x) { return std::isfinite(x) && x > 0; };
  require(positive(hw.peak_flops_bf16), hw, "peak_flops_bf16", "must be a positive FLOP/s rate");
  require(finite_nonneg(hw.peak_flops_fp32), hw, "peak_flops_fp32", "must be >= 0");
  require(finite_nonneg(hw.peak_flops_fp32_cuda_core), hw, "peak_flops_fp32_cuda_core", "must be >= 0");
  require(finite_nonneg(hw.peak_flops_fp64), hw, "peak_flops_fp64", "must be >= 0");
  require(finite_nonneg(hw.peak_flops_fp8), hw, "peak_flops_fp8", "must be >= 0");
  require(positive(hw.hbm_bandwidth), hw, "hbm_bandwidth", "must be a positive bytes/s rate");
  require(finite_nonneg(hw.memory_bytes), hw, "memory_bytes", "must be >= 0");
  require(positive(hw.flop_efficiency) && hw.flop_efficiency <= 1, hw, "flop_efficiency", "must be in (0, 1]");
  require(positive(hw.bandwidth_efficiency) && hw.bandwidth_efficiency <= 1, hw, "bandwidth_efficiency",
          "must be in (0, 1]");
  require(finite_nonneg(hw.kernel_floor_us), hw, "kernel_floor_us", "must be >= 0");
  require(hw.gpus_per_node >= 1, hw, "gpus_per_node", "must be >= 1");
  require(positive(hw.intra_node_bandwidth), hw, "intra_node_bandwidth", "must be a positive bytes/s rate");
  require(positive(hw.inter_node_bandwidth), hw, "inter_node_bandwidth", "must be a positive bytes/s rate");
  require(finite_nonneg(hw.intra_node_latency_us), hw, "intra_node_latency_us", "must be >= 0");
  require(finite_nonneg(hw.inter_node_latency_us), hw, "inter_node_latency_us", "must be >= 0");
  require(positive(hw.intra_node_efficiency) && hw.intra_node_efficiency <= 1, hw, "intra_node_efficiency",
          "must be in (0, 1]");
  require(positive(hw.inter_node_efficiency) && hw.inter_node_efficiency <= 1, hw, "inter_node_efficiency",
          "must be in (0, 1]");
  require(finite_nonneg(hw.collective_launch_us), hw, "collective_launch_us", "must be >= 0");
  require(finite_nonneg(hw.comm_overlap) && hw.comm_overlap <= 1, hw, "comm_overlap", "must be in [0, 1]");
}

}  // namespace autoshard
