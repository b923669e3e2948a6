// `_core.plan_graph(graph_json, options_json) -> plan_json`: bad input, unsupported ops and
// infeasible constraints raise ValueError with the planner's message.
#include <nanobind/stl/string.h>

#include <stdexcept>

#include "io/plan_json.h"
#include "bindings.h"

namespace nb = nanobind;

namespace autoshard::bindings {
void register_planner(nb::module_& m) {
  m.def(
      "plan_graph",
      [](const std::string& graph_json, const std::string& options_json) {
        std::string result, error;
        {
          nb::gil_scoped_release release;  // planning is pure C++; let other Python threads run
          try {
            result = plan_graph_json(graph_json, options_json);
          } catch (const std::exception& e) {
            error = e.what();
          }
        }
        // Every planner failure is a problem with the input or the constraints.
        if (!error.empty()) throw nb::value_error(error.c_str());
        return result;
      },
      nb::arg("graph_json"), nb::arg("options_json"),
      "Plan a traced tensor graph (docs/formats.md section 1) on a device mesh; returns the plan JSON "
      "(section 3) with a human-readable \"report\" field. Raises ValueError on bad input, an op "
      "without a sharding rule, or constraints no plan satisfies.");
}
}  // namespace autoshard::bindings
