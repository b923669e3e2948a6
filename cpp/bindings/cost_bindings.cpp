// Cost models exposed to Python (hardware profiles, roofline, collectives), so the calibration
// bench and Python tests use the same numbers as the planner. Errors (unknown hardware, dtype,
// collective) raise ValueError with the C++ message.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "autoshard/cost_model.h"
#include "io/hardware_json.h"
#include "bindings.h"

namespace nb = nanobind;

namespace autoshard::bindings {
namespace {

nb::dict profile_dict(const HardwareProfile& hw) {
  nb::dict d;
  d["name"] = hw.name;
  d["peak_flops_fp32"] = hw.peak_flops_fp32;
  d["peak_flops_fp32_cuda_core"] = hw.peak_flops_fp32_cuda_core;
  d["peak_flops_bf16"] = hw.peak_flops_bf16;
  d["peak_flops_fp64"] = hw.peak_flops_fp64;
  d["peak_flops_fp8"] = hw.peak_flops_fp8;
  d["hbm_bandwidth"] = hw.hbm_bandwidth;
  d["memory_bytes"] = hw.memory_bytes;
  d["flop_efficiency"] = hw.flop_efficiency;
  d["bandwidth_efficiency"] = hw.bandwidth_efficiency;
  d["kernel_floor_us"] = hw.kernel_floor_us;
  d["gpus_per_node"] = hw.gpus_per_node;
  d["intra_node_bandwidth"] = hw.intra_node_bandwidth;
  d["intra_node_latency_us"] = hw.intra_node_latency_us;
  d["intra_node_efficiency"] = hw.intra_node_efficiency;
  d["inter_node_bandwidth"] = hw.inter_node_bandwidth;
  d["inter_node_latency_us"] = hw.inter_node_latency_us;
  d["inter_node_efficiency"] = hw.inter_node_efficiency;
  d["collective_launch_us"] = hw.collective_launch_us;
  d["fp32_matmul_uses_tf32"] = hw.fp32_matmul_uses_tf32;
  return d;
}

Collective parse_collective(const std::string& name) {
  if (name == "all_gather") return Collective::AllGather;
  if (name == "reduce_scatter") return Collective::ReduceScatter;
  if (name == "all_reduce") return Collective::AllReduce;
  if (name == "all_to_all") return Collective::AllToAll;
  throw std::invalid_argument("unknown collective '" + name +
                              "'; expected all_gather, reduce_scatter, all_reduce or all_to_all");
}

CollectiveAlgorithm parse_algorithm(const std::string& name) {
  if (name == "auto") return CollectiveAlgorithm::Auto;
  if (name == "ring") return CollectiveAlgorithm::Ring;
  if (name == "tree") return CollectiveAlgorithm::Tree;
  throw std::invalid_argument("unknown collective algorithm '" + name + "'; expected auto, ring or tree");
}

// `hardware` is a profile name ("H100") or a JSON object of profile fields, optionally with a
// "base" profile: '{"base": "H100", "gpus_per_node": 4}'.
HardwareProfile resolve(const std::string& hardware) { return hardware_profile_from_text(hardware); }

HardwareProfile profile_with_tf32(const std::string& hardware, bool allow_tf32) {
  HardwareProfile hw = resolve(hardware);
  hw.fp32_matmul_uses_tf32 = allow_tf32;
  return hw;
}

}  // namespace

void register_cost(nb::module_& m) {
  m.def("known_hardware", &known_hardware, "Names of the built-in hardware profiles.");
  m.def(
      "hardware_profile", [](const std::string& name) { return profile_dict(resolve(name)); }, nb::arg("name"),
      "A profile (a built-in name or a JSON object of fields with an optional \"base\") as a dict "
      "(rates per second, times in us, sizes in bytes).");
  m.def(
      "dtype_bytes", [](const std::string& dtype) { return dtype_bytes(parse_dtype(dtype)); }, nb::arg("dtype"),
      "Bytes per element of a torch dtype name.");
  m.def(
      "compute_time_us",
      [](const std::string& hardware, double flops, double bytes_moved, const std::string& dtype, bool allow_tf32) {
        return compute_time_us(profile_with_tf32(hardware, allow_tf32), flops, bytes_moved, parse_dtype(dtype));
      },
      nb::arg("hardware"), nb::arg("flops"), nb::arg("bytes_moved"), nb::arg("dtype"), nb::arg("allow_tf32") = true,
      "Roofline time (us) of one kernel: max(flops/(peak*eff), bytes/(bw*eff), floor).");
  m.def(
      "memory_time_us",
      [](const std::string& hardware, double bytes_moved) { return memory_time_us(resolve(hardware), bytes_moved); },
      nb::arg("hardware"), nb::arg("bytes_moved"), "Time (us) of a memory-bound kernel moving that many bytes.");
  m.def(
      "mesh_dim_links",
      [](const std::string& hardware, const std::vector<int64_t>& mesh_shape) {
        nb::list out;
        for (const auto& l : mesh_dim_links(resolve(hardware), mesh_shape)) {
          nb::dict d;
          d["group_size"] = l.group_size;
          d["nodes"] = l.nodes;
          d["ranks_per_node"] = l.ranks_per_node;
          d["bandwidth"] = l.bandwidth;
          d["latency_us"] = l.latency_us;
          d["launch_us"] = l.launch_us;
          d["intra_latency_us"] = l.intra_latency_us;
          out.append(d);
        }
        return out;
      },
      nb::arg("hardware"), nb::arg("mesh_shape"), "The link each mesh dim's process groups run over.");
  m.def(
      "collective_time_us",
      [](const std::string& kind, double bytes, const std::string& hardware, const std::vector<int64_t>& mesh_shape,
         int mesh_dim, const std::string& algorithm) {
        auto links = mesh_dim_links(resolve(hardware), mesh_shape);
        if (mesh_dim < 0 || static_cast<size_t>(mesh_dim) >= links.size())
          throw std::invalid_argument("mesh_dim " + std::to_string(mesh_dim) + " is outside a mesh with " +
                                      std::to_string(links.size()) + " dims");
        return collective_time_us(parse_collective(kind), bytes, links[static_cast<size_t>(mesh_dim)],
                                  parse_algorithm(algorithm));
      },
      nb::arg("kind"), nb::arg("bytes"), nb::arg("hardware"), nb::arg("mesh_shape"), nb::arg("mesh_dim"),
      nb::arg("algorithm") = "auto",
      "Time (us) of one collective over a mesh dim; bytes = the full buffer along that dim.");
  m.def("padded_collective_bytes", &padded_collective_bytes, nb::arg("dim_size"), nb::arg("group_size"),
        nb::arg("bytes_per_row"), "ceil(dim_size / group_size) * group_size * bytes_per_row.");
}

}  // namespace autoshard::bindings
