// Checked accessors of non-tensor argument values: rules read shapes, dims and flags through
// them, so a traced argument of an unexpected kind fails with a message naming it.
#include <stdexcept>
#include <string>

#include "autoshard/graph.h"

namespace autoshard {

namespace {
const char* kind_name(ArgValue::Kind k) {
  switch (k) {
    case ArgValue::Kind::None:
      return "None";
    case ArgValue::Kind::Int:
      return "an integer";
    case ArgValue::Kind::Float:
      return "a float";
    case ArgValue::Kind::Bool:
      return "a bool";
    case ArgValue::Kind::String:
      return "a string";
    case ArgValue::Kind::Tensor:
      return "a tensor";
    case ArgValue::Kind::List:
      return "a list";
    case ArgValue::Kind::DType:
      return "a dtype";
    case ArgValue::Kind::Device:
      return "a device";
    case ArgValue::Kind::Enum:
      return "an enum";
  }
  return "?";
}
[[noreturn]] void mismatch(const char* what, const char* want, ArgValue::Kind got) {
  throw std::invalid_argument(std::string(what) + ": expected " + want + ", found " + kind_name(got));
}
}  // namespace

int64_t ArgValue::as_int(const char* what) const {
  if (kind == Kind::Int) return i;
  if (kind == Kind::Bool) return b ? 1 : 0;
  mismatch(what, "an integer", kind);
}

double ArgValue::as_number(const char* what) const {
  if (kind == Kind::Int) return static_cast<double>(i);
  if (kind == Kind::Float) return f;
  if (kind == Kind::Bool) return b ? 1.0 : 0.0;
  mismatch(what, "a number", kind);
}

bool ArgValue::as_bool(const char* what) const {
  if (kind == Kind::Bool) return b;
  if (kind == Kind::Int) return i != 0;
  mismatch(what, "a bool", kind);
}

std::vector<int64_t> ArgValue::as_int_list(const char* what) const {
  if (kind == Kind::Int) return {i};
  if (kind != Kind::List) mismatch(what, "a list of integers", kind);
  std::vector<int64_t> out;
  out.reserve(list.size());
  for (const auto& e : list) {
    if (e.kind != Kind::Int) mismatch(what, "a list of integers", e.kind);
    out.push_back(e.i);
  }
  return out;
}

}  // namespace autoshard
