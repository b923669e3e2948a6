// Hardware profiles to and from JSON, so a planner option or a user can describe hardware
// that is not built in (or override a built-in profile's network, node size, efficiencies).
#include "io/hardware_json.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace autoshard {
namespace {

// One row per numeric field: its JSON key and where it lives in the struct.
struct NumberField {
  const char* key;
  double HardwareProfile::*member;
};

const std::vector<NumberField>& number_fields() {
  static const std::vector<NumberField> fields = {
      {"peak_flops_fp32", &HardwareProfile::peak_flops_fp32},
      {"peak_flops_fp32_cuda_core", &HardwareProfile::peak_flops_fp32_cuda_core},
      {"peak_flops_bf16", &HardwareProfile::peak_flops_bf16},
      {"peak_flops_fp64", &HardwareProfile::peak_flops_fp64},
      {"peak_flops_fp8", &HardwareProfile::peak_flops_fp8},
      {"hbm_bandwidth", &HardwareProfile::hbm_bandwidth},
      {"memory_bytes", &HardwareProfile::memory_bytes},
      {"flop_efficiency", &HardwareProfile::flop_efficiency},
      {"bandwidth_efficiency", &HardwareProfile::bandwidth_efficiency},
      {"kernel_floor_us", &HardwareProfile::kernel_floor_us},
      {"intra_node_bandwidth", &HardwareProfile::intra_node_bandwidth},
      {"intra_node_latency_us", &HardwareProfile::intra_node_latency_us},
      {"intra_node_efficiency", &HardwareProfile::intra_node_efficiency},
      {"inter_node_bandwidth", &HardwareProfile::inter_node_bandwidth},
      {"inter_node_latency_us", &HardwareProfile::inter_node_latency_us},
      {"inter_node_efficiency", &HardwareProfile::inter_node_efficiency},
      {"collective_launch_us", &HardwareProfile::collective_launch_us},
      {"comm_overlap", &HardwareProfile::comm_overlap},
  };
  return fields;
}

std::string known_keys() {
  std::string s = "base, name, gpus_per_node, fp32_matmul_uses_tf32, reduce_scatter_via_all_reduce";
  for (const auto& f : number_fields()) s += std::string(", ") + f.key;
  return s;
}

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw std::invalid_argument("hardware." + key + ": " + what);
}

}  // namespace

HardwareProfile hardware_profile_from_json(const Json& spec) {
  if (spec.is_string()) return hardware_profile(json_string(spec));
  if (!spec.is_object())
    throw std::invalid_argument(std::string("hardware: expected a profile name or an object, got ") +
                                json_kind_name(spec));
  HardwareProfile hw;
  if (const Json* base = json_find(spec, "base")) {
    if (!base->is_string()) bad("base", "expected a known profile name");
    hw = hardware_profile(json_string(*base));
  }
  for (const auto& [key, value] : json_items(spec)) {
    if (key == "base") continue;
    if (key == "name") {
      if (!value.is_string()) bad(key, "expected a string");
      hw.name = json_string(value);
      continue;
    }
    if (key == "gpus_per_node") {
      if (!json_is_int64(value) || json_int(value) < 1 || json_int(value) > (1 << 20))
        bad(key, "expected an integer >= 1");
      hw.gpus_per_node = static_cast<int>(json_int(value));
      continue;
    }
    if (key == "fp32_matmul_uses_tf32") {
      if (!value.is_boolean()) bad(key, "expected true or false");
      hw.fp32_matmul_uses_tf32 = json_bool(value);
      continue;
    }
    if (key == "reduce_scatter_via_all_reduce") {
      if (!value.is_boolean()) bad(key, "expected true or false");
      hw.reduce_scatter_via_all_reduce = json_bool(value);
      continue;
    }
    bool found = false;
    for (const auto& f : number_fields()) {
      if (key != f.key) continue;
      if (!value.is_number()) bad(key, std::string("expected a number, got ") + json_kind_name(value));
      hw.*(f.member) = json_double(value);
      found = true;
      break;
    }
    if (!found) bad(key, "unknown field; known fields: " + known_keys());
  }
  if (hw.name.empty()) hw.name = "custom";
  validate_hardware_profile(hw);
  return hw;
}

HardwareProfile hardware_profile_from_text(std::string_view text) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') return hardware_profile_from_json(parse_json(text));
  return hardware_profile(text);
}

Json hardware_profile_to_json(const HardwareProfile& hw) {
  Json j = Json::object();
  j["name"] = hw.name;
  j["gpus_per_node"] = hw.gpus_per_node;
  j["fp32_matmul_uses_tf32"] = hw.fp32_matmul_uses_tf32;
  j["reduce_scatter_via_all_reduce"] = hw.reduce_scatter_via_all_reduce;
  for (const auto& f : number_fields()) j[f.key] = json_number(hw.*(f.member));
  return j;
}

}  // namespace autoshard
