// The Python extension `autoshard._core`. Each concept registers its own bindings from its
// own file (register_*), so this file only lists them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sstream>

#include "autoshard/cli.h"
#include "bindings.h"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "autoshard C++ core";
  m.def(
      "cli_main",
      [](const std::vector<std::string>& args) {
        std::ostringstream out, err;
        int rc = autoshard::cli_main(args, out, err);
        return nb::make_tuple(rc, out.str(), err.str());
      },
      "Run `autoshard <args>`; returns (exit code, stdout text, stderr text).");
  autoshard::bindings::register_json(m);
  autoshard::bindings::register_planner(m);
  autoshard::bindings::register_cost(m);
  autoshard::bindings::register_strategies(m);
}
