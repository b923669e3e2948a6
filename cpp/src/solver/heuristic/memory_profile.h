// The live-usage profile of a plan over compressed time (live_points, graph_view.h), kept up
// to date under single-node changes. A segment tree (range add, range max) answers "does this
// change fit?" in O(log T).
#pragma once

#include <cstdint>
#include <vector>

#include "graph_view.h"

namespace autoshard::detail {

class MemoryProfile {
 public:
  MemoryProfile(const GraphView& g, int64_t limit);

  int32_t num_points() const { return num_points_; }
  int64_t limit() const { return limit_; }
  bool limited() const { return limit_ >= 0; }
  // Node i is live at compressed points [first(i), last(i)); empty when never live.
  int32_t first(int32_t i) const { return points_.first[i]; }
  int32_t last(int32_t i) const { return points_.last[i]; }
  int64_t time_of(int32_t point) const { return points_.times[point]; }

  void reset(const std::vector<int32_t>& x);
  // Applies node i moving from label `from` to label `to`.
  void move(int32_t i, int32_t from, int32_t to);
  int64_t max_over(int32_t lo, int32_t hi) const;  // [lo, hi), -inf style 0 when empty
  int64_t peak() const { return num_points_ ? tree_max_[1] : 0; }
  int32_t peak_point() const;
  // Whether node i may switch between labels without breaking the limit anywhere.
  bool fits(int32_t i, int32_t from, int32_t to) const;
  // The profile value at every point (for subgradients).
  void values(std::vector<int64_t>& out) const;

 private:
  const GraphView& g_;
  int64_t limit_;
  LivePoints points_;
  int32_t num_points_ = 0, size_ = 1;
  std::vector<int64_t> tree_max_, tree_add_;  // max of subtree including its own add

  void add(int32_t lo, int32_t hi, int64_t delta, int32_t node, int32_t nlo, int32_t nhi);
  int64_t query(int32_t lo, int32_t hi, int32_t node, int32_t nlo, int32_t nhi) const;
};

}  // namespace autoshard::detail
