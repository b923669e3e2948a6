#include "heuristic/memory_profile.h"

#include <algorithm>
#include <limits>

namespace autoshard::detail {

MemoryProfile::MemoryProfile(const GraphView& g, int64_t limit) : g_(g), limit_(limit), points_(live_points(g)) {
  num_points_ = points_.size();
  while (size_ < std::max(num_points_, 1)) size_ *= 2;
  tree_max_.assign(2 * size_, 0);
  tree_add_.assign(2 * size_, 0);
}

void MemoryProfile::add(int32_t lo, int32_t hi, int64_t delta, int32_t node, int32_t nlo, int32_t nhi) {
  if (hi <= nlo || nhi <= lo) return;
  if (lo <= nlo && nhi <= hi) {
    tree_add_[node] += delta;
    tree_max_[node] += delta;
    return;
  }
  const int32_t mid = (nlo + nhi) / 2;
  add(lo, hi, delta, 2 * node, nlo, mid);
  add(lo, hi, delta, 2 * node + 1, mid, nhi);
  tree_max_[node] = std::max(tree_max_[2 * node], tree_max_[2 * node + 1]) + tree_add_[node];
}

int64_t MemoryProfile::query(int32_t lo, int32_t hi, int32_t node, int32_t nlo, int32_t nhi) const {
  if (hi <= nlo || nhi <= lo) return std::numeric_limits<int64_t>::min() / 4;
  if (lo <= nlo && nhi <= hi) return tree_max_[node];
  const int32_t mid = (nlo + nhi) / 2;
  return std::max(query(lo, hi, 2 * node, nlo, mid), query(lo, hi, 2 * node + 1, mid, nhi)) + tree_add_[node];
}

void MemoryProfile::reset(const std::vector<int32_t>& x) {
  std::vector<int64_t> diff(size_ + 1, 0);
  for (int32_t i = 0; i < g_.num_nodes; ++i) {
    if (first(i) >= last(i)) continue;
    const int64_t u = g_.usages(i)[x[i]];
    diff[first(i)] += u;
    diff[last(i)] -= u;
  }
  std::fill(tree_add_.begin(), tree_add_.end(), 0);
  int64_t run = 0;
  for (int32_t t = 0; t < size_; ++t) {
    run += diff[t];
    // Padding leaves beyond the last point hold no usage: give them a very low value.
    tree_max_[size_ + t] = t < num_points_ ? run : std::numeric_limits<int64_t>::min() / 4;
    tree_add_[size_ + t] = tree_max_[size_ + t];
  }
  for (int32_t v = size_ - 1; v >= 1; --v) tree_max_[v] = std::max(tree_max_[2 * v], tree_max_[2 * v + 1]);
}

void MemoryProfile::move(int32_t i, int32_t from, int32_t to) {
  if (first(i) >= last(i) || from == to) return;
  const int64_t delta = g_.usages(i)[to] - g_.usages(i)[from];
  if (delta != 0) add(first(i), last(i), delta, 1, 0, size_);
}

int64_t MemoryProfile::max_over(int32_t lo, int32_t hi) const {
  if (lo >= hi) return 0;
  return query(lo, hi, 1, 0, size_);
}

int32_t MemoryProfile::peak_point() const {
  int32_t v = 1;
  while (v < size_) v = tree_max_[2 * v] + tree_add_[v] == tree_max_[v] ? 2 * v : 2 * v + 1;
  return v - size_;
}

bool MemoryProfile::fits(int32_t i, int32_t from, int32_t to) const {
  if (limit_ < 0 || first(i) >= last(i)) return true;
  const int64_t delta = g_.usages(i)[to] - g_.usages(i)[from];
  if (delta <= 0) return true;
  return max_over(first(i), last(i)) + delta <= limit_;
}

void MemoryProfile::values(std::vector<int64_t>& out) const {
  out.resize(num_points_);
  for (int32_t t = 0; t < num_points_; ++t) {
    int64_t v = 0;
    for (int32_t node = size_ + t; node >= 1; node /= 2) v += tree_add_[node];
    out[t] = v;
  }
}

}  // namespace autoshard::detail
