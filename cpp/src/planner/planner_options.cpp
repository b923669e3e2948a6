// Parsing of the planner options JSON (see planner.h). Unknown fields are rejected so a typo
// never silently drops a constraint.
#include <charconv>
#include <cmath>
#include <set>
#include <stdexcept>

#include "autoshard/layout.h"
#include "autoshard/planner.h"
#include "autoshard/solver.h"

namespace autoshard {

namespace {

Mesh parse_mesh(const Json& j) {
  if (!j.is_object()) throw JsonError("options.mesh: expected {\"shape\": [8, 8], \"dim_names\": [\"dp\", \"tp\"]}");
  Mesh m;
  for (const auto& [k, v] : j.items("options.mesh")) {
    if (k == "shape") {
      for (const auto& d : v.as_array("options.mesh.shape")) {
        int64_t s = d.as_int("options.mesh.shape");
        if (s < 1) throw JsonError("options.mesh.shape: sizes must be >= 1, found " + std::to_string(s));
        m.shape.push_back(s);
      }
    } else if (k == "dim_names") {
      if (v.is_null()) continue;
      for (const auto& d : v.as_array("options.mesh.dim_names")) m.dim_names.push_back(d.as_string("options.mesh.dim_names"));
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

// Shortest form that reads back exactly (0.25, 1e-09), for messages.
std::string fmt(double x) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

double fraction(const Json& v, const char* where) {
  double f = v.as_double(where);
  if (!(f >= 0.0 && f <= 1.0)) throw JsonError(std::string(where) + ": must be a fraction in [0, 1], found " + std::to_string(f));
  return f;
}

}  // namespace

PlannerOptions parse_planner_options(const Json& doc) {
  if (!doc.is_object()) throw JsonError("options: expected a JSON object");
  PlannerOptions o;
  const Json* mesh = doc.find("mesh");
  if (!mesh) throw JsonError("options: missing field \"mesh\" (e.g. {\"shape\": [8, 8]})");
  o.mesh = parse_mesh(*mesh);
  const double default_high = 1.0 / static_cast<double>(o.mesh.size());
  for (const auto& [k, v] : doc.items("options")) {
    if (k == "mesh") continue;
    if (k == "hardware") {
      // a profile name, or an object of profile fields (carried as its JSON text)
      if (v.is_object()) o.hardware = v.dump();
      else if (!v.is_null()) o.hardware = v.as_string("options.hardware");
    } else if (k == "parameter_memory") {
      o.parameter_memory_default = false;
      if (v.is_null()) { o.parameter_memory.reset(); continue; }
      double low = 0.0, high = default_high;
      if (v.is_array()) {
        const auto& a = v.as_array();
        if (a.size() != 2) throw JsonError("options.parameter_memory: expected [low, high] or {\"low\":..., \"high\":...}");
        if (!a[0].is_null()) low = fraction(a[0], "options.parameter_memory[0]");
        if (!a[1].is_null()) high = fraction(a[1], "options.parameter_memory[1]");
      } else {
        for (const auto& [pk, pv] : v.items("options.parameter_memory")) {
          if (pk == "low") { if (!pv.is_null()) low = fraction(pv, "options.parameter_memory.low"); }
          else if (pk == "high") { if (!pv.is_null()) high = fraction(pv, "options.parameter_memory.high"); }
          else throw JsonError("options.parameter_memory: unknown field \"" + pk + "\" (expected low, high)");
        }
      }
      if (low > high)
        throw JsonError("options.parameter_memory: low (" + std::to_string(low) + ") is above high (" +
                        std::to_string(high) + ")");
      o.parameter_memory = std::make_pair(low, high);
    } else if (k == "memory_limit_bytes") {
      if (v.is_null()) continue;
      o.memory_limit_bytes = v.as_int("options.memory_limit_bytes");
      if (o.memory_limit_bytes <= 0)
        throw JsonError("options.memory_limit_bytes: must be > 0 bytes per GPU, found " +
                        std::to_string(o.memory_limit_bytes) + "; for no limit leave it out (or null)");
    } else if (k == "input_constraints") {
      if (v.is_null()) continue;
      for (const auto& [name, l] : v.items("options.input_constraints"))
        o.constraints.inputs[name] = parse_layout(l, o.mesh, "options.input_constraints." + name);
    } else if (k == "node_constraints") {
      if (v.is_null()) continue;
      for (const auto& [name, l] : v.items("options.node_constraints"))
        o.constraints.nodes[name] = parse_layout(l, o.mesh, "options.node_constraints." + name);
    } else if (k == "output_constraints") {
      if (v.is_null()) continue;
      if (v.is_array()) {
        const auto& a = v.as_array();
        for (size_t i = 0; i < a.size(); ++i)
          if (!a[i].is_null())
            o.constraints.outputs[static_cast<int>(i)] =
                parse_layout(a[i], o.mesh, "options.output_constraints[" + std::to_string(i) + "]");
      } else {
        for (const auto& [key, l] : v.items("options.output_constraints")) {
          size_t pos = 0;
          int idx = -1;
          try { idx = std::stoi(key, &pos); } catch (const std::exception&) { pos = 0; }
          if (pos != key.size() || idx < 0)
            throw JsonError("options.output_constraints: key \"" + key + "\" is not an output index");
          o.constraints.outputs[idx] = parse_layout(l, o.mesh, "options.output_constraints." + key);
        }
      }
    } else if (k == "time_limit_s") {
      if (v.is_null()) continue;
      try {
        o.time_limit_s = checked_time_limit(v.as_double("options.time_limit_s"), "options.time_limit_s");
      } catch (const std::invalid_argument& e) {
        throw JsonError(e.what());
      }
    } else if (k == "gap_tolerance") {
      if (v.is_null()) continue;
      try {
        o.gap_tolerance = checked_gap_tolerance(v.as_double("options.gap_tolerance"), "options.gap_tolerance");
      } catch (const std::invalid_argument& e) {
        throw JsonError(e.what());
      }
    } else if (k == "max_problem_bytes") {
      if (v.is_null()) continue;
      o.max_problem_bytes = v.as_int("options.max_problem_bytes");
      if (o.max_problem_bytes <= 0)
        throw JsonError("options.max_problem_bytes: must be > 0, found " + std::to_string(o.max_problem_bytes));
    } else if (k == "verbose") {
      o.verbose = !v.is_null() && v.as_bool("options.verbose");
    } else {
      throw JsonError("options: unknown field \"" + k +
                      "\" (expected mesh, hardware, parameter_memory, memory_limit_bytes, input_constraints, "
                      "output_constraints, node_constraints, time_limit_s, gap_tolerance, max_problem_bytes, verbose)");
    }
  }
  validate_planner_options(o);
  return o;
}

void validate_planner_options(const PlannerOptions& o) {
  using std::invalid_argument;
  if (o.mesh.shape.empty()) throw invalid_argument("mesh: no dimensions given (e.g. --mesh 8x8, shape [8, 8])");
  int64_t size = 1;
  for (int64_t s : o.mesh.shape) {
    if (s < 1) throw invalid_argument("mesh: sizes must be >= 1, found " + std::to_string(s));
    if (s > (int64_t{1} << 20) / size)
      throw invalid_argument("mesh: more than 2^20 GPUs in total; no plan is made for meshes that large");
    size *= s;
  }
  if (!o.mesh.dim_names.empty() && o.mesh.dim_names.size() != o.mesh.shape.size())
    throw invalid_argument("mesh: " + std::to_string(o.mesh.dim_names.size()) + " dim names for " +
                           std::to_string(o.mesh.shape.size()) + " mesh dims");
  if (!o.parameter_memory_default && o.parameter_memory) {
    const auto [low, high] = *o.parameter_memory;
    if (!(low >= 0 && low <= high && high <= 1))
      throw invalid_argument("parameter memory: need 0 <= low <= high <= 1 (fractions of all parameter bytes), got low=" +
                             fmt(low) + " high=" + fmt(high));
    // Even with every parameter sharded over every GPU, one GPU holds at least 1/size of it
    // (the largest chunk of an uneven split holds more), so a smaller high bound can never be
    // met; it used to be quietly raised to what the parameters reach.
    const double least = 1.0 / static_cast<double>(size);
    if (high < least * (1 - 1e-9))
      throw invalid_argument("parameter memory: high=" + fmt(high) + " is below " + fmt(least) + " = 1/" +
                             std::to_string(size) + ", the least fraction of the parameters any plan can store per "
                             "GPU on this mesh (every parameter sharded over all " + std::to_string(size) +
                             " GPUs); pass high >= " + fmt(least) + " (--param-memory " + fmt(low) + "," + fmt(least) +
                             ", add_parameter_memory_constraint(high=" + fmt(least) +
                             "), or leave high out for that default), or drop the constraint (--no-param-memory, "
                             "remove_parameter_memory_constraint())");
  }
  if (o.memory_limit_bytes == 0 || o.memory_limit_bytes < -1)
    throw invalid_argument("memory limit: must be > 0 bytes per GPU, got " + std::to_string(o.memory_limit_bytes) +
                           "; for no limit leave it out (--memory-limit, memory_limit_bytes)");
  checked_time_limit(o.time_limit_s, "time limit (--time-limit, time_limit_s)");
  checked_gap_tolerance(o.gap_tolerance, "gap tolerance (--gap-tolerance, gap_tolerance)");
  if (o.max_problem_bytes < 0)
    throw invalid_argument("max problem bytes: must be > 0 (or 0 for the default cap), got " +
                           std::to_string(o.max_problem_bytes));
}

}  // namespace autoshard
