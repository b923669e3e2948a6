// Placement text form (docs/formats.md section 2) and mesh size.
#include "autoshard/placement.h"

#include <charconv>
#include <stdexcept>
#include <string>

namespace autoshard {

static const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate:
      return "R";
    case Kind::Shard:
      return "S(" + std::to_string(dim) + ")";
    case Kind::Partial:
      return std::string("P(") + reduce_name(reduce) + ")";
  }
  return "?";
}

Placement Placement::parse(std::string_view text) {
  auto bad = [&]() -> std::invalid_argument {
    return std::invalid_argument("invalid placement '" + std::string(text) +
                                 "' (expected R, S(<dim>), P(sum), P(avg), P(max) or P(min))");
  };
  if (text == "R") return replicate();
  if (text.size() >= 4 && text.back() == ')' && text[1] == '(') {
    std::string_view inner = text.substr(2, text.size() - 3);
    if (text[0] == 'S') {
      int d = -1;
      auto [p, ec] = std::from_chars(inner.data(), inner.data() + inner.size(), d);
      if (ec != std::errc() || p != inner.data() + inner.size() || d < 0) throw bad();
      return shard(d);
    }
    if (text[0] == 'P') {
      if (inner == "sum") return partial(ReduceOp::Sum);
      if (inner == "avg") return partial(ReduceOp::Avg);
      if (inner == "max") return partial(ReduceOp::Max);
      if (inner == "min") return partial(ReduceOp::Min);
    }
  }
  if (text == "P") return partial(ReduceOp::Sum);
  throw bad();
}

std::string layout_str(const Layout& l) {
  std::string s;
  for (const auto& p : l) s += p.str();
  return s;
}

std::string layout_list_str(const Layout& l) {
  std::string s = "[";
  for (size_t i = 0; i < l.size(); ++i) s += (i ? ",\"" : "\"") + l[i].str() + "\"";
  return s + "]";
}

int64_t Mesh::size() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace autoshard
