// Shared by the planner tests: options on a mesh with a short time limit (the graphs are
// tiny), and the message of whatever a call throws.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autoshard/planner.h"

inline autoshard::PlannerOptions planner_options(std::vector<int64_t> mesh, double time_limit_s = 2) {
  autoshard::PlannerOptions o;
  o.mesh.shape = std::move(mesh);
  o.time_limit_s = time_limit_s;
  return o;
}

// The message of the exception `f` throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
