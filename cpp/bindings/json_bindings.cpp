// JSON round trip, exposed so Python tests can check the parser's error messages.
#include <nanobind/stl/string.h>

#include "io/json.h"
#include "bindings.h"

namespace nb = nanobind;

namespace autoshard::bindings {
void register_json(nb::module_& m) {
  nb::exception<JsonError>(m, "JsonError", PyExc_ValueError);
  m.def(
      "json_roundtrip", [](const std::string& text) { return dump_json(parse_json(text)); },
      "Parse JSON text with the C++ parser and write it back compactly.");
}
}  // namespace autoshard::bindings
