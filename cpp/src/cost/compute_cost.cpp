// Roofline compute model: a kernel takes the longer of its arithmetic time at the achievable
// FLOP rate and its memory-traffic time at the achievable HBM rate, and never less than the
// per-kernel floor (launch + dispatch).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"

namespace autoshard {
namespace {

void check_amount(double x, const char* what) {
  if (!std::isfinite(x) || x < 0)
    throw std::invalid_argument(std::string(what) + " must be a finite non-negative number, got " + std::to_string(x));
}

double fp32_rate(const HardwareProfile& hw) {
  if (hw.fp32_matmul_uses_tf32 || hw.peak_flops_fp32_cuda_core <= 0) return hw.peak_flops_fp32;
  return hw.peak_flops_fp32_cuda_core;
}

}  // namespace

double peak_flops(const HardwareProfile& hw, DType dtype) {
  switch (dtype) {
    case DType::Float32:
    case DType::Complex64:
      return fp32_rate(hw);
    case DType::BFloat16:
    case DType::Float16:
    case DType::Complex32:
      return hw.peak_flops_bf16;
    case DType::Float64:
    case DType::Complex128:
      return hw.peak_flops_fp64;
    case DType::Float8:
    case DType::Float8E5M2:
    case DType::Float8E4M3FNUZ:
    case DType::Float8E5M2FNUZ:
    case DType::Float8E8M0FNU:
    case DType::Float4E2M1FNx2:
      // No FP8 tensor cores (A100): the work runs at the 16-bit rate at best. FP4 on B200 is
      // charged at the FP8 rate (conservative; its 2x rate is not modelled).
      return hw.peak_flops_fp8 > 0 ? hw.peak_flops_fp8 : hw.peak_flops_bf16;
    default:
      return 0;  // integer and bool kernels are memory bound
  }
}

double compute_time_us(const HardwareProfile& hw, double flops, double bytes_moved, DType dtype) {
  check_amount(flops, "compute_time_us: flops");
  check_amount(bytes_moved, "compute_time_us: bytes_moved");
  if (flops == 0 && bytes_moved == 0) return 0;  // no kernel (views, metadata-only ops)
  double flop_us = 0;
  if (flops > 0) {
    double peak = peak_flops(hw, dtype);
    if (peak > 0) {
      flop_us = flops / (peak * hw.flop_efficiency) * 1e6;
    } else if (dtype_is_floating(dtype) || dtype_is_complex(dtype)) {
      throw std::invalid_argument("hardware profile '" + hw.name + "' has no peak FLOP/s for dtype " +
                                  std::string(dtype_name(dtype)) + "; set the matching peak_flops_* field");
    }
  }
  return std::max(flop_us, memory_time_us(hw, bytes_moved));
}

double memory_time_us(const HardwareProfile& hw, double bytes_moved) {
  check_amount(bytes_moved, "memory_time_us: bytes_moved");
  if (hw.hbm_bandwidth <= 0 || hw.bandwidth_efficiency <= 0)
    throw std::invalid_argument("hardware profile '" + hw.name +
                                "' needs positive hbm_bandwidth and bandwidth_efficiency");
  double us = bytes_moved / (hw.hbm_bandwidth * hw.bandwidth_efficiency) * 1e6;
  return std::max(us, hw.kernel_floor_us);
}

}  // namespace autoshard
