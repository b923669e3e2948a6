// Registration functions of the extension's parts, one per concept file.
#pragma once
#include <nanobind/nanobind.h>

namespace autoshard::bindings {
void register_json(nanobind::module_& m);
void register_planner(nanobind::module_& m);
void register_cost(nanobind::module_& m);
void register_strategies(nanobind::module_& m);
void register_pipeline(nanobind::module_& m);
}  // namespace autoshard::bindings
