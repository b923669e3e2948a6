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
      [](nb::sequence argv) {
        // Arguments are taken as the OS gave them: a file name that is not UTF-8 reaches
        // Python as a str with surrogate escapes, which a plain std::string conversion
        // rejects with a TypeError; the file-system encoding turns it back into its bytes.
        std::vector<std::string> args;
        for (nb::handle a : argv) {
          if (PyBytes_Check(a.ptr())) {
            args.emplace_back(PyBytes_AsString(a.ptr()), static_cast<size_t>(PyBytes_Size(a.ptr())));
            continue;
          }
          if (!PyUnicode_Check(a.ptr())) throw nb::type_error("cli_main: every argument must be a str or bytes");
          nb::object raw = nb::steal(PyUnicode_EncodeFSDefault(a.ptr()));
          if (!raw.is_valid()) throw nb::python_error();
          args.emplace_back(PyBytes_AsString(raw.ptr()), static_cast<size_t>(PyBytes_Size(raw.ptr())));
        }
        std::ostringstream out, err;
        int rc = autoshard::cli_main(args, out, err);
        // A message may quote bytes from a user's file or path that are not UTF-8; decoding
        // them strictly would turn a clear error into a Python traceback.
        auto text = [](const std::string& s) {
          return nb::steal<nb::str>(
              PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace"));
        };
        return nb::make_tuple(rc, text(out.str()), text(err.str()));
      },
      "Run `autoshard <args>`; returns (exit code, stdout text, stderr text).");
  autoshard::bindings::register_json(m);
  autoshard::bindings::register_planner(m);
  autoshard::bindings::register_cost(m);
  autoshard::bindings::register_strategies(m);
  autoshard::bindings::register_pipeline(m);
}
