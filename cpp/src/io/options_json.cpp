// Parsing of the planner options JSON (format in options_json.h). Unknown fields are rejected
// so a typo never silently drops a constraint.
#include "io/options_json.h"

#include <optional>
#include <stdexcept>
#include <string>

#include "autoshard/solver.h"
#include "io/hardware_json.h"
#include "io/layout_json.h"

namespace autoshard {

namespace {

Mesh parse_mesh(const Json& j) {
  if (!j.is_object()) throw JsonError("options.mesh: expected {\"shape\": [8, 8], \"dim_names\": [\"dp\", \"tp\"]}");
  Mesh m;
  for (const auto& [k, v] : json_items(j, "options.mesh")) {
    if (k == "shape") {
      for (const auto& d : json_array(v, "options.mesh.shape")) {
        int64_t s = json_int(d, "options.mesh.shape");
        if (s < 1) throw JsonError("options.mesh.shape: sizes must be >= 1, found " + std::to_string(s));
        m.shape.push_back(s);
      }
    } else if (k == "dim_names") {
      if (v.is_null()) continue;
      for (const auto& d : json_array(v, "options.mesh.dim_names"))
        m.dim_names.push_back(json_string(d, "options.mesh.dim_names"));
    } else {
      throw JsonError("options.mesh: unknown field \"" + k + "\" (expected shape, dim_names)");
    }
  }
  if (m.shape.empty()) throw JsonError("options.mesh.shape: missing or empty (e.g. [8, 8])");
  if (!m.dim_names.empty() && m.dim_names.size() != m.shape.size())
    throw JsonError("options.mesh.dim_names: " + std::to_string(m.dim_names.size()) + " names for " +
                    std::to_string(m.shape.size()) + " mesh dims");
  return m;
}

double fraction(const Json& v, const char* where) {
  double f = json_double(v, where);
  if (!(f >= 0.0 && f <= 1.0))
    throw JsonError(std::string(where) + ": must be a fraction in [0, 1], found " + std::to_string(f));
  return f;
}

// torch.backends.cuda.matmul.fp32_precision: "tf32" runs float32 matmuls on TF32 tensor
// cores; "ieee" (PyTorch's default) runs them in full float32.
bool parse_fp32_matmul_precision(const std::string& value) {
  if (value == "tf32") return true;
  if (value == "ieee") return false;
  throw JsonError("options.fp32_matmul_precision: expected \"ieee\" (full float32, PyTorch's default) or "
                  "\"tf32\" (TF32 tensor cores), found \"" + value + "\"");
}

}  // namespace

PlannerOptions parse_planner_options(const Json& doc) {
  if (!doc.is_object()) throw JsonError("options: expected a JSON object");
  PlannerOptions o;
  const Json* mesh = json_find(doc, "mesh");
  if (!mesh) throw JsonError("options: missing field \"mesh\" (e.g. {\"shape\": [8, 8]})");
  o.mesh = parse_mesh(*mesh);
  const double default_high = 1.0 / static_cast<double>(o.mesh.size());
  // applied after the loop: "hardware" may come after it and would reset the profile's flag
  std::optional<bool> fp32_matmul_tf32;
  for (const auto& [k, v] : json_items(doc, "options")) {
    if (k == "mesh") continue;
    if (k == "hardware") {
      // a profile name, or an object of profile fields (carried as its JSON text)
      if (v.is_object())
        o.hardware = hardware_profile_from_json(v);
      else if (!v.is_null())
        o.hardware = hardware_profile(json_string(v, "options.hardware"));
    } else if (k == "parameter_memory") {
      o.parameter_memory_default = false;
      if (v.is_null()) {
        o.parameter_memory.reset();
        continue;
      }
      double low = 0.0, high = default_high;
      if (v.is_array()) {
        const auto& a = json_array(v);
        if (a.size() != 2)
          throw JsonError("options.parameter_memory: expected [low, high] or {\"low\":..., \"high\":...}");
        if (!a[0].is_null()) low = fraction(a[0], "options.parameter_memory[0]");
        if (!a[1].is_null()) high = fraction(a[1], "options.parameter_memory[1]");
      } else {
        for (const auto& [pk, pv] : json_items(v, "options.parameter_memory")) {
          if (pk == "low") {
            if (!pv.is_null()) low = fraction(pv, "options.parameter_memory.low");
          } else if (pk == "high") {
            if (!pv.is_null()) high = fraction(pv, "options.parameter_memory.high");
          } else
            throw JsonError("options.parameter_memory: unknown field \"" + pk + "\" (expected low, high)");
        }
      }
      if (low > high)
        throw JsonError("options.parameter_memory: low (" + std::to_string(low) + ") is above high (" +
                        std::to_string(high) + ")");
      o.parameter_memory = std::make_pair(low, high);
    } else if (k == "memory_limit_bytes") {
      if (v.is_null()) continue;
      o.memory_limit_bytes = json_int(v, "options.memory_limit_bytes");
      if (o.memory_limit_bytes <= 0)
        throw JsonError("options.memory_limit_bytes: must be > 0 bytes per GPU, found " +
                        std::to_string(o.memory_limit_bytes) + "; for no limit leave it out (or null)");
    } else if (k == "input_constraints") {
      if (v.is_null()) continue;
      for (const auto& [name, l] : json_items(v, "options.input_constraints"))
        o.constraints.inputs[name] = parse_layout(l, o.mesh, "options.input_constraints." + name);
    } else if (k == "node_constraints") {
      if (v.is_null()) continue;
      for (const auto& [name, l] : json_items(v, "options.node_constraints"))
        o.constraints.nodes[name] = parse_layout(l, o.mesh, "options.node_constraints." + name);
    } else if (k == "output_constraints") {
      if (v.is_null()) continue;
      if (v.is_array()) {
        const auto& a = json_array(v);
        for (size_t i = 0; i < a.size(); ++i)
          if (!a[i].is_null())
            o.constraints.outputs[static_cast<int>(i)] =
                parse_layout(a[i], o.mesh, "options.output_constraints[" + std::to_string(i) + "]");
      } else {
        for (const auto& [key, l] : json_items(v, "options.output_constraints")) {
          size_t pos = 0;
          int idx = -1;
          try {
            idx = std::stoi(key, &pos);
          } catch (const std::exception&) {
            pos = 0;
          }
          if (pos != key.size() || idx < 0)
            throw JsonError("options.output_constraints: key \"" + key + "\" is not an output index");
          o.constraints.outputs[idx] = parse_layout(l, o.mesh, "options.output_constraints." + key);
        }
      }
    } else if (k == "time_limit_s") {
      if (v.is_null()) continue;
      try {
        o.time_limit_s = checked_time_limit(json_double(v, "options.time_limit_s"), "options.time_limit_s");
      } catch (const std::invalid_argument& e) {
        throw JsonError(e.what());
      }
    } else if (k == "gap_tolerance") {
      if (v.is_null()) continue;
      try {
        o.gap_tolerance = checked_gap_tolerance(json_double(v, "options.gap_tolerance"), "options.gap_tolerance");
      } catch (const std::invalid_argument& e) {
        throw JsonError(e.what());
      }
    } else if (k == "max_problem_bytes") {
      if (v.is_null()) continue;
      o.max_problem_bytes = json_int(v, "options.max_problem_bytes");
      if (o.max_problem_bytes <= 0)
        throw JsonError("options.max_problem_bytes: must be > 0, found " + std::to_string(o.max_problem_bytes));
    } else if (k == "repeated_layers") {
      if (v.is_null()) continue;
      try {
        o.repeated_layers = parse_layer_tying(json_string(v, "options.repeated_layers"), "options.repeated_layers");
      } catch (const std::invalid_argument& e) {
        throw JsonError(e.what());
      }
    } else if (k == "fp32_matmul_precision") {
      if (v.is_null()) continue;
      fp32_matmul_tf32 = parse_fp32_matmul_precision(json_string(v, "options.fp32_matmul_precision"));
    } else if (k == "optimizer") {
      if (v.is_null()) continue;
      try {
        o.optimizer.kind = parse_optimizer_kind(json_string(v, "options.optimizer"), "options.optimizer");
      } catch (const std::invalid_argument& e) {
        throw JsonError(e.what());
      }
    } else if (k == "recompute") {
      if (v.is_null()) continue;
      try {
        o.recompute = parse_recompute_mode(json_string(v, "options.recompute"), "options.recompute");
      } catch (const std::invalid_argument& e) {
        throw JsonError(e.what());
      }
    } else if (k == "verbose") {
      o.verbose = !v.is_null() && json_bool(v, "options.verbose");
    } else {
      throw JsonError("options: unknown field \"" + k +
                      "\" (expected mesh, hardware, parameter_memory, memory_limit_bytes, input_constraints, "
                      "output_constraints, node_constraints, time_limit_s, gap_tolerance, max_problem_bytes, "
                      "repeated_layers, fp32_matmul_precision, optimizer, recompute, verbose)");
    }
  }
  if (fp32_matmul_tf32) o.hardware.fp32_matmul_uses_tf32 = *fp32_matmul_tf32;
  validate_planner_options(o);
  return o;
}

}  // namespace autoshard
