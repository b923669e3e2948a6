// The min-plus products of message passing (heuristic/min_plus.h) against the plain double
// loop, on matrices of every small shape (so that the 8-wide blocks leave every remainder),
// with the infeasible-cost marker and ties.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "solver/heuristic/min_plus.h"

namespace autoshard {
namespace {

using detail::min_plus_by_cols;
using detail::min_plus_by_rows;

TEST(MinPlus, BothLayoutsMatchThePlainLoop) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> pick(0, 9);
  auto value = [&] {
    const int k = pick(rng);
    return k == 0 ? kInfeasibleCost : k == 1 ? 0.0 : double(int(rng() % 2001) - 1000) * 0.25;
  };
  for (int32_t rows = 1; rows <= 20; ++rows)
    for (int32_t cols = 1; cols <= 20; ++cols) {
      std::vector<Cost> m(size_t(rows) * cols), by_row(rows), by_col(cols);
      for (Cost& c : m) c = value();
      for (Cost& c : by_row) c = value();
      for (Cost& c : by_col) c = value();
      // a holds one value per row: out[t] = min_s a[s] + m[s][t].
      std::vector<Cost> out(cols), want(cols, std::numeric_limits<Cost>::max());
      min_plus_by_rows(by_row.data(), m.data(), rows, cols, out.data());
      for (int32_t s = 0; s < rows; ++s)
        for (int32_t t = 0; t < cols; ++t) want[t] = std::min(want[t], by_row[s] + m[size_t(s) * cols + t]);
      EXPECT_EQ(out, want) << rows << " x " << cols;
      // a holds one value per column: out[t] = min_s a[s] + m[t][s].
      out.assign(rows, 0.0);
      want.assign(rows, std::numeric_limits<Cost>::max());
      min_plus_by_cols(by_col.data(), m.data(), rows, cols, out.data());
      for (int32_t t = 0; t < rows; ++t)
        for (int32_t s = 0; s < cols; ++s) want[t] = std::min(want[t], by_col[s] + m[size_t(t) * cols + s]);
      EXPECT_EQ(out, want) << rows << " x " << cols;
    }
}

}  // namespace
}  // namespace autoshard
