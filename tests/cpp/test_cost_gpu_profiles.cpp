// The GPU profiles as the Python API picks them (torch.cuda.get_device_name of each part) and
// the float32 matmul precision the options carry (PyTorch's default is full float32, not TF32).
#include <gtest/gtest.h>

#include <string>

#include "autoshard/cost_model.h"
#include "autoshard/planner.h"
#include "io/json.h"
#include "io/options_json.h"

namespace autoshard {
namespace {

TEST(GpuProfiles, DeviceNamesOfTheSxmPartsFindTheirProfiles) {
  // torch.cuda.get_device_name on each part's SXM board
  EXPECT_EQ(hardware_profile("NVIDIA A100-SXM4-80GB").name, "A100");
  EXPECT_EQ(hardware_profile("NVIDIA H100 80GB HBM3").name, "H100");
  EXPECT_EQ(hardware_profile("NVIDIA H200").name, "H200");
  EXPECT_EQ(hardware_profile("NVIDIA B200").name, "B200");
  // other variants are other hardware: refused here (the Python side then uses the family's
  // profile with the device's own memory and says so)
  EXPECT_THROW(hardware_profile("NVIDIA H100 PCIe"), std::invalid_argument);
  EXPECT_THROW(hardware_profile("NVIDIA A100-SXM4-40GB"), std::invalid_argument);
}

TEST(GpuProfiles, DatasheetFiguresPerPart) {
  // memory (bytes), dense bf16 and TF32 and plain fp32 FLOP/s, HBM and NVLink (one way) bytes/s
  struct Row {
    const char* name;
    double memory, bf16, tf32, fp32, hbm, nvlink;
  };
  const Row rows[] = {
      {"A100", 80e9, 312e12, 156e12, 19.5e12, 2039e9, 300e9},
      {"H100", 80e9, 989.5e12, 494.5e12, 67e12, 3.35e12, 450e9},
      {"H200", 141e9, 989.5e12, 494.5e12, 67e12, 4.8e12, 450e9},
      {"B200", 180e9, 2.25e15, 1.125e15, 75e12, 8e12, 900e9},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.name);
    const auto& hw = hardware_profile(r.name);
    EXPECT_DOUBLE_EQ(hw.memory_bytes, r.memory);
    EXPECT_DOUBLE_EQ(hw.peak_flops_bf16, r.bf16);
    EXPECT_DOUBLE_EQ(hw.peak_flops_fp32, r.tf32);
    EXPECT_DOUBLE_EQ(hw.peak_flops_fp32_cuda_core, r.fp32);
    EXPECT_DOUBLE_EQ(hw.hbm_bandwidth, r.hbm);
    EXPECT_DOUBLE_EQ(hw.intra_node_bandwidth, r.nvlink);
  }
}

PlannerOptions parse(const std::string& text) { return parse_planner_options(parse_json(text)); }

TEST(Fp32MatmulPrecision, IeeePricesFloat32AtTheCudaCoreRate) {
  auto o = parse(R"({"mesh": {"shape": [8]}, "hardware": "H100", "fp32_matmul_precision": "ieee"})");
  EXPECT_FALSE(o.hardware.fp32_matmul_uses_tf32);
  EXPECT_DOUBLE_EQ(peak_flops(o.hardware, DType::Float32), 67e12);
  // bf16 is untouched
  EXPECT_DOUBLE_EQ(peak_flops(o.hardware, DType::BFloat16), 989.5e12);
}

TEST(Fp32MatmulPrecision, Tf32PricesFloat32AtTheTensorCoreRate) {
  auto o = parse(R"({"mesh": {"shape": [8]}, "hardware": "A100", "fp32_matmul_precision": "tf32"})");
  EXPECT_TRUE(o.hardware.fp32_matmul_uses_tf32);
  EXPECT_DOUBLE_EQ(peak_flops(o.hardware, DType::Float32), 156e12);
}

TEST(Fp32MatmulPrecision, AppliesWhateverTheOrderOfTheFields) {
  // the precision given before the hardware still sets the hardware's flag
  auto o = parse(R"({"fp32_matmul_precision": "ieee", "mesh": {"shape": [8]}, "hardware": "B200"})");
  EXPECT_FALSE(o.hardware.fp32_matmul_uses_tf32);
  auto custom = parse(
      R"({"fp32_matmul_precision": "ieee", "mesh": {"shape": [8]},
          "hardware": {"base": "H100", "fp32_matmul_uses_tf32": true}})");
  EXPECT_FALSE(custom.hardware.fp32_matmul_uses_tf32);
}

TEST(Fp32MatmulPrecision, AbsentOrNullKeepsTheProfilesOwnSetting) {
  EXPECT_TRUE(parse(R"({"mesh": {"shape": [8]}, "hardware": "H100"})").hardware.fp32_matmul_uses_tf32);
  EXPECT_TRUE(parse(R"({"mesh": {"shape": [8]}, "hardware": "H100", "fp32_matmul_precision": null})")
                  .hardware.fp32_matmul_uses_tf32);
  EXPECT_FALSE(parse(R"({"mesh": {"shape": [8]}, "hardware": "CPU"})").hardware.fp32_matmul_uses_tf32);
}

TEST(Fp32MatmulPrecision, UnknownValueNamesTheChoices) {
  try {
    parse(R"({"mesh": {"shape": [8]}, "fp32_matmul_precision": "highest"})");
    FAIL() << "no error for an unknown precision";
  } catch (const std::exception& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("options.fp32_matmul_precision"), std::string::npos) << what;
    EXPECT_NE(what.find("\"ieee\""), std::string::npos) << what;
    EXPECT_NE(what.find("\"tf32\""), std::string::npos) << what;
    EXPECT_NE(what.find("highest"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace autoshard
