// Hardware profiles from and to JSON (custom hardware, overrides of a built-in profile).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"
#include "io/json.h"
#include "io/hardware_json.h"

using namespace autoshard;

namespace {
std::string error_of(const std::string& text) {
  try {
    hardware_profile_from_json(parse_json(text));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(CostHardwareJson, NameOrBaseWithOverrides) {
  EXPECT_EQ(hardware_profile_from_json(parse_json(R"("H200")")).memory_bytes, 141e9);
  HardwareProfile hw = hardware_profile_from_json(
      parse_json(R"({"base": "H100", "gpus_per_node": 4, "inter_node_bandwidth": 25000000000, "name": "H100x4"})"));
  EXPECT_EQ(hw.name, "H100x4");
  EXPECT_EQ(hw.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(hw.inter_node_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(hw.peak_flops_bf16, 989.5e12);  // kept from the base
  // The override changes the links: {2, 4} now spans 2 nodes on its outer dim.
  auto links = mesh_dim_links(hw, {2, 4});
  EXPECT_EQ(links[0].nodes, 2);
  EXPECT_DOUBLE_EQ(links[0].bandwidth, 25e9 * 0.9);
  EXPECT_EQ(links[1].nodes, 1);
}

TEST(CostHardwareJson, RoundTripsEveryField) {
  for (const auto& name : known_hardware()) {
    HardwareProfile hw = hardware_profile(name);
    hw.fp32_matmul_uses_tf32 = false;
    hw.kernel_floor_us = 3.25;
    Json j = parse_json(hardware_profile_to_json(hw).dump());
    HardwareProfile back = hardware_profile_from_json(j);
    EXPECT_EQ(back.name, hw.name);
    EXPECT_EQ(back.gpus_per_node, hw.gpus_per_node);
    EXPECT_EQ(back.fp32_matmul_uses_tf32, false);
    EXPECT_EQ(back.reduce_scatter_via_all_reduce, hw.reduce_scatter_via_all_reduce);
    EXPECT_EQ(back.peak_flops_fp32, hw.peak_flops_fp32);
    EXPECT_EQ(back.peak_flops_fp32_cuda_core, hw.peak_flops_fp32_cuda_core);
    EXPECT_EQ(back.peak_flops_bf16, hw.peak_flops_bf16);
    EXPECT_EQ(back.peak_flops_fp64, hw.peak_flops_fp64);
    EXPECT_EQ(back.peak_flops_fp8, hw.peak_flops_fp8);
    EXPECT_EQ(back.hbm_bandwidth, hw.hbm_bandwidth);
    EXPECT_EQ(back.memory_bytes, hw.memory_bytes);
    EXPECT_EQ(back.flop_efficiency, hw.flop_efficiency);
    EXPECT_EQ(back.bandwidth_efficiency, hw.bandwidth_efficiency);
    EXPECT_EQ(back.kernel_floor_us, 3.25);
    EXPECT_EQ(back.intra_node_bandwidth, hw.intra_node_bandwidth);
    EXPECT_EQ(back.intra_node_latency_us, hw.intra_node_latency_us);
    EXPECT_EQ(back.intra_node_efficiency, hw.intra_node_efficiency);
    EXPECT_EQ(back.inter_node_bandwidth, hw.inter_node_bandwidth);
    EXPECT_EQ(back.inter_node_latency_us, hw.inter_node_latency_us);
    EXPECT_EQ(back.inter_node_efficiency, hw.inter_node_efficiency);
    EXPECT_EQ(back.collective_launch_us, hw.collective_launch_us);
  }
}

TEST(CostHardwareJson, ErrorsNameTheKey) {
  EXPECT_NE(error_of(R"({"base": "H100", "hbm_bandwith": 1e12})").find("hardware.hbm_bandwith: unknown field"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"base": "H100", "gpus_per_node": 2.5})").find("hardware.gpus_per_node"), std::string::npos);
  EXPECT_NE(error_of(R"({"base": "H100", "hbm_bandwidth": "fast"})").find("hardware.hbm_bandwidth"), std::string::npos);
  EXPECT_NE(error_of(R"({"base": "H999"})").find("unknown hardware 'H999'"), std::string::npos);
  EXPECT_NE(error_of(R"({"base": "H100", "flop_efficiency": 2})").find("flop_efficiency"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("expected a profile name or an object"), std::string::npos);
  // A profile without a base must give the rates itself.
  EXPECT_NE(error_of(R"({"name": "mine"})").find("peak_flops_bf16"), std::string::npos);
  HardwareProfile mine = hardware_profile_from_json(parse_json(
      R"({"name": "mine", "peak_flops_bf16": 1e14, "hbm_bandwidth": 1e12, "intra_node_bandwidth": 1e11,
          "inter_node_bandwidth": 1e10})"));
  EXPECT_EQ(mine.name, "mine");
  EXPECT_DOUBLE_EQ(compute_time_us(mine, 7e13, 0, DType::BFloat16), 1e6);  // 70 TFLOP at 100 T * 0.7
}

TEST(CostHardwareJson, FromTextTakesANameOrAnObject) {
  EXPECT_EQ(hardware_profile_from_text("H100").name, "H100");
  HardwareProfile hw = hardware_profile_from_text(R"( {"base": "CPU", "collective_launch_us": 900})");
  EXPECT_DOUBLE_EQ(hw.collective_launch_us, 900);
  EXPECT_TRUE(hw.reduce_scatter_via_all_reduce);  // kept from the base
  EXPECT_THROW(hardware_profile_from_text("{\"base\": \"CPU\", \"warp\": 1}"), std::invalid_argument);
}
