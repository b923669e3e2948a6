// Hardware profiles and the roofline compute model, against hand-computed numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"

using namespace autoshard;

TEST(CostHardware, KnowsTheGpuProfilesAndTheCpuGlooOne) {
  auto names = known_hardware();
  ASSERT_EQ(names.size(), 5u);
  EXPECT_EQ(names[0], "A100");
  EXPECT_EQ(names[1], "H100");
  EXPECT_EQ(names[2], "H200");
  EXPECT_EQ(names[3], "B200");
  EXPECT_EQ(names[4], "CPU");
  EXPECT_EQ(hardware_profile("gloo").name, "CPU");
  for (const auto& n : names) EXPECT_NO_THROW(validate_hardware_profile(hardware_profile(n))) << n;
}

TEST(CostHardware, DatasheetNumbers) {
  const auto& h100 = hardware_profile("H100");
  EXPECT_DOUBLE_EQ(h100.peak_flops_bf16, 989.5e12);  // 1,979 TFLOPS sparse / 2
  EXPECT_DOUBLE_EQ(h100.peak_flops_fp32, 494.5e12);  // TF32
  EXPECT_DOUBLE_EQ(h100.peak_flops_fp8, 1979e12);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth, 3.35e12);
  EXPECT_DOUBLE_EQ(h100.intra_node_bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(h100.inter_node_bandwidth, 50e9);  // 400 Gb/s NDR per GPU
  const auto& h200 = hardware_profile("H200");
  EXPECT_DOUBLE_EQ(h200.peak_flops_bf16, h100.peak_flops_bf16);
  EXPECT_DOUBLE_EQ(h200.hbm_bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(h200.memory_bytes, 141e9);
  const auto& a100 = hardware_profile("A100");
  EXPECT_DOUBLE_EQ(a100.peak_flops_bf16, 312e12);
  EXPECT_DOUBLE_EQ(a100.hbm_bandwidth, 2039e9);
  EXPECT_DOUBLE_EQ(a100.inter_node_bandwidth, 25e9);
  const auto& b200 = hardware_profile("B200");
  EXPECT_DOUBLE_EQ(b200.peak_flops_bf16, 2.25e15);
  EXPECT_DOUBLE_EQ(b200.hbm_bandwidth, 8e12);
  EXPECT_DOUBLE_EQ(b200.intra_node_bandwidth, 900e9);
}

TEST(CostHardware, AliasesAreCaseInsensitiveAndExact) {
  EXPECT_EQ(hardware_profile("h100").name, "H100");
  EXPECT_EQ(hardware_profile("NVIDIA H100 80GB HBM3").name, "H100");
  EXPECT_EQ(hardware_profile(" NVIDIA A100-SXM4-80GB ").name, "A100");
  EXPECT_EQ(hardware_profile("NVIDIA H200").name, "H200");
  // Different hardware is not silently approximated by a near name.
  EXPECT_THROW(hardware_profile("NVIDIA A100-SXM4-40GB"), std::invalid_argument);
  EXPECT_THROW(hardware_profile("H100 PCIe"), std::invalid_argument);
}

TEST(CostHardware, UnknownNameListsKnownOnes) {
  try {
    hardware_profile("TPUv5");
    FAIL();
  } catch (const std::invalid_argument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'TPUv5'"), std::string::npos) << msg;
    for (const char* n : {"A100", "H100", "H200", "B200"}) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(CostHardware, ValidateNamesTheBadField) {
  HardwareProfile hw = hardware_profile("H100");
  hw.hbm_bandwidth = 0;
  try {
    validate_hardware_profile(hw);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hbm_bandwidth"), std::string::npos) << e.what();
  }
  hw = hardware_profile("H100");
  hw.flop_efficiency = 1.5;
  EXPECT_THROW(validate_hardware_profile(hw), std::invalid_argument);
}

TEST(CostCompute, LargeBf16MatmulOnH100IsComputeBound) {
  const auto& hw = hardware_profile("H100");
  const double n = 4096;
  double flops = 2 * n * n * n;
  double bytes = 3 * n * n * 2;                         // A, B read, C written, bf16
  double expected_us = flops / (989.5e12 * 0.7) * 1e6;  // = 198.4 us
  EXPECT_NEAR(compute_time_us(hw, flops, bytes, DType::BFloat16), expected_us, 1e-9 * expected_us);
  EXPECT_NEAR(expected_us, 198.43, 0.01);
  // Its memory time is far below: 100.7 MB / (3.35 TB/s * 0.8) = 37.6 us.
  EXPECT_NEAR(memory_time_us(hw, bytes), bytes / (3.35e12 * 0.8) * 1e6, 1e-9);
  EXPECT_LT(memory_time_us(hw, bytes), expected_us);
}

TEST(CostCompute, PointwiseIsMemoryBound) {
  const auto& hw = hardware_profile("H100");
  double numel = 4096.0 * 4096.0;
  double bytes = 3 * numel * 2;  // a + b -> c in bf16
  double expected_us = bytes / (3.35e12 * 0.8) * 1e6;
  EXPECT_NEAR(compute_time_us(hw, numel, bytes, DType::BFloat16), expected_us, 1e-9 * expected_us);
}

TEST(CostCompute, FloorAndZero) {
  const auto& hw = hardware_profile("H100");
  EXPECT_DOUBLE_EQ(compute_time_us(hw, 10, 40, DType::Float32), hw.kernel_floor_us);
  EXPECT_DOUBLE_EQ(compute_time_us(hw, 0, 0, DType::Float32), 0.0);  // views: no kernel
  EXPECT_DOUBLE_EQ(memory_time_us(hw, 8), hw.kernel_floor_us);
  EXPECT_DOUBLE_EQ(hw.kernel_floor_us, 5.0);
}

TEST(CostCompute, IntegerDTypesIgnoreFlops) {
  const auto& hw = hardware_profile("H100");
  double bytes = 1e9;
  double mem_us = bytes / (3.35e12 * 0.8) * 1e6;
  // 1e15 "flops" would take ~1.4 s at the bf16 rate; integers are charged memory time only.
  EXPECT_NEAR(compute_time_us(hw, 1e15, bytes, DType::Int64), mem_us, 1e-6);
  EXPECT_NEAR(compute_time_us(hw, 1e15, bytes, DType::Bool), mem_us, 1e-6);
  EXPECT_EQ(peak_flops(hw, DType::Int32), 0.0);
}

TEST(CostCompute, PeakPerDType) {
  HardwareProfile hw = hardware_profile("H100");
  EXPECT_DOUBLE_EQ(peak_flops(hw, DType::Float32), 494.5e12);
  EXPECT_DOUBLE_EQ(peak_flops(hw, DType::Float16), 989.5e12);
  EXPECT_DOUBLE_EQ(peak_flops(hw, DType::Float8E5M2), 1979e12);
  EXPECT_DOUBLE_EQ(peak_flops(hw, DType::Float64), 67e12);
  hw.fp32_matmul_uses_tf32 = false;  // PyTorch's default float32 matmul precision
  EXPECT_DOUBLE_EQ(peak_flops(hw, DType::Float32), 67e12);
  // A100 has no FP8 tensor cores: fp8 work runs at the bf16 rate.
  EXPECT_DOUBLE_EQ(peak_flops(hardware_profile("A100"), DType::Float8), 312e12);
}

TEST(CostCompute, Fp32MatmulWithoutTf32IsSlower) {
  HardwareProfile hw = hardware_profile("A100");
  double flops = 2.0 * 8192 * 8192 * 8192;
  double tf32 = compute_time_us(hw, flops, 0, DType::Float32);
  hw.fp32_matmul_uses_tf32 = false;
  double simt = compute_time_us(hw, flops, 0, DType::Float32);
  EXPECT_NEAR(simt / tf32, 156.0 / 19.5, 1e-9);
}

TEST(CostCompute, RejectsBadAmounts) {
  const auto& hw = hardware_profile("H100");
  EXPECT_THROW(compute_time_us(hw, -1, 0, DType::Float32), std::invalid_argument);
  EXPECT_THROW(compute_time_us(hw, 0, NAN, DType::Float32), std::invalid_argument);
  EXPECT_THROW(memory_time_us(hw, -5), std::invalid_argument);
  HardwareProfile no_fp64 = hw;
  no_fp64.peak_flops_fp64 = 0;
  try {
    compute_time_us(no_fp64, 1e9, 1, DType::Float64);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
  }
}

TEST(CostCompute, MonotonicInFlopsAndBytes) {
  const auto& hw = hardware_profile("B200");
  double prev = 0;
  for (double x = 1; x < 1e16; x *= 3.7) {
    double t = compute_time_us(hw, x, x / 100, DType::BFloat16);
    EXPECT_GE(t, prev);
    prev = t;
  }
}
