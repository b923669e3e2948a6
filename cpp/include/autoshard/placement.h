// Placements of a tensor on a device mesh (DTensor semantics, docs/formats.md section 2).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace autoshard {

enum class ReduceOp { Sum, Avg, Max, Min };

struct Placement {
  enum class Kind { Replicate, Shard, Partial };
  Kind kind = Kind::Replicate;
  int dim = 0;                      // Shard: tensor dim (non-negative)
  ReduceOp reduce = ReduceOp::Sum;  // Partial

  static Placement replicate() { return {}; }
  static Placement shard(int d) { return {Kind::Shard, d, ReduceOp::Sum}; }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return {Kind::Partial, 0, op}; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int d) const { return kind == Kind::Shard && dim == d; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind != Kind::Shard || dim == o.dim) && (kind != Kind::Partial || reduce == o.reduce);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  std::string str() const;                        // "R", "S(0)", "P(sum)"
  static Placement parse(std::string_view text);  // inverse of str(); throws on bad text
};

// One placement per mesh dim.
using Layout = std::vector<Placement>;
std::string layout_str(const Layout& l);       // "S(0)R" compact, for reports
std::string layout_list_str(const Layout& l);  // ["S(0)","R"]: the list spelling of constraints, for messages

struct Mesh {
  std::vector<int64_t> shape;          // e.g. {8, 8}
  std::vector<std::string> dim_names;  // e.g. {"dp", "tp"}
  int64_t size() const;
  int ndim() const { return static_cast<int>(shape.size()); }
};

}  // namespace autoshard
