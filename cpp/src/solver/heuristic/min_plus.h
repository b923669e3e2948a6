// Min-plus products of a vector with an edge's cost matrix (row-major), the inner loops of
// message passing, of its lower bound and of the tree LNS's dynamic programming.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "graph_view.h"

namespace autoshard::detail {

// out[t] = min over s of a[s] + m[s * cols + t], for t < cols (a holds one value per row).
// Row by row, so the inner loop runs along contiguous memory and vectorizes.
inline void min_plus_by_rows(const Cost* a, const Cost* m, int32_t rows, int32_t cols, Cost* out) {
  std::fill(out, out + cols, std::numeric_limits<Cost>::max());
  for (int32_t s = 0; s < rows; ++s) {
    const Cost base = a[s];
    const Cost* row = m + int64_t(s) * cols;
    for (int32_t t = 0; t < cols; ++t) out[t] = std::min(out[t], base + row[t]);
  }
}

// out[t] = min over s of a[s] + m[t * cols + s], for t < rows (a holds one value per column).
// Each row's minimum is kept in 8 independent running minima, four 2-wide vectors (GCC's
// vector extension: one SSE2 instruction per operation): a single running minimum is a chain of
// dependent operations that neither vectorizes nor overlaps (it was 70 % of the message
// passing's time on the 3-D planner problems, ~300 labels a node).
inline void min_plus_by_cols(const Cost* a, const Cost* m, int32_t rows, int32_t cols, Cost* out) {
  using V2 = Cost __attribute__((vector_size(2 * sizeof(Cost))));
  constexpr Cost kBig = std::numeric_limits<Cost>::max();
  constexpr int32_t kLanes = 4;  // vectors
  for (int32_t t = 0; t < rows; ++t) {
    const Cost* row = m + int64_t(t) * cols;
    V2 acc[kLanes];
    for (V2& v : acc) v = V2{kBig, kBig};
    int32_t s = 0;
    for (; s + 2 * kLanes <= cols; s += 2 * kLanes)
      for (int32_t l = 0; l < kLanes; ++l) {
        V2 x, y;
        std::memcpy(&x, a + s + 2 * l, sizeof x);
        std::memcpy(&y, row + s + 2 * l, sizeof y);
        x += y;
        acc[l] = x < acc[l] ? x : acc[l];
      }
    Cost best = kBig;
    for (; s < cols; ++s) best = std::min(best, a[s] + row[s]);
    for (const V2& v : acc) best = std::min({best, v[0], v[1]});
    out[t] = best;
  }
}

}  // namespace autoshard::detail
