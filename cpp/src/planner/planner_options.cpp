// Checks of the planner options, wherever they come from (options file, command line, C++
// callers), with messages that name the option under each of its names.
#include <charconv>
#include <stdexcept>
#include <string>

#include "autoshard/planner.h"
#include "autoshard/solver.h"

namespace autoshard {

namespace {

// Shortest form that reads back exactly (0.25, 1e-09), for messages.
std::string fmt(double x) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

}  // namespace

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
      throw invalid_argument(
          "parameter memory: need 0 <= low <= high <= 1 (fractions of all parameter bytes), got low=" + fmt(low) +
          " high=" + fmt(high));
    // Even with every parameter sharded over every GPU, one GPU holds at least 1/size of it
    // (the largest chunk of an uneven split holds more), so a smaller high bound can never be
    // met; it used to be quietly raised to what the parameters reach.
    const double least = 1.0 / static_cast<double>(size);
    if (high < least * (1 - 1e-9))
      throw invalid_argument("parameter memory: high=" + fmt(high) + " is below " + fmt(least) + " = 1/" +
                             std::to_string(size) +
                             ", the least fraction of the parameters any plan can store per "
                             "GPU on this mesh (every parameter sharded over all " +
                             std::to_string(size) + " GPUs); pass high >= " + fmt(least) + " (--param-memory " +
                             fmt(low) + "," + fmt(least) + ", add_parameter_memory_constraint(high=" + fmt(least) +
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

namespace autoshard {

LayerTying parse_layer_tying(const std::string& name, const std::string& what) {
  if (name == "auto") return LayerTying::Auto;
  if (name == "tie") return LayerTying::Tie;
  if (name == "untie") return LayerTying::Untie;
  throw std::invalid_argument(what + ": expected \"auto\", \"tie\" or \"untie\", found \"" + name + "\"");
}

const char* layer_tying_name(LayerTying t) {
  switch (t) {
    case LayerTying::Tie:
      return "tie";
    case LayerTying::Untie:
      return "untie";
    default:
      return "auto";
  }
}

}  // namespace autoshard

namespace autoshard {

int64_t default_memory_limit(const HardwareProfile& hardware) {
  return static_cast<int64_t>(hardware.memory_bytes * (1.0 - kMemoryReserveFraction));
}

OptimizerKind parse_optimizer_kind(const std::string& name, const std::string& what) {
  if (name == "adam" || name == "adamw") return OptimizerKind::Adam;
  if (name == "sgd") return OptimizerKind::SGD;
  if (name == "sgd_momentum") return OptimizerKind::SGDMomentum;
  if (name == "none") return OptimizerKind::None;
  throw std::invalid_argument(what + ": unknown optimizer \"" + name +
                              "\" (expected adam, adamw, sgd, sgd_momentum or none: whose state the memory "
                              "estimate counts)");
}

}  // namespace autoshard
