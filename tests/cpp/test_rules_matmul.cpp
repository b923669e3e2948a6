// Matrix-product rules on concrete shapes, their FLOPs, and a numeric check of every mm row
// (simulated ranks with chunk semantics, compared with the unsharded product).
#include <cmath>
#include <functional>

#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesMatmul, MmRows) {
  auto c = make_case("aten.mm.default", {{{32, 64}}, {{64, 128}}}, "[$0, $1]", {{{32, 128}}});
  std::set<std::string> want = {"S(0)|S(0),R",     "S(1)|R,S(1)",     "P(sum)|S(1),S(0)", "P(sum)|P(sum),R",
                                "P(sum)|R,P(sum)", "P(avg)|P(avg),R", "P(avg)|R,P(avg)"};
  EXPECT_EQ(row_set(c->rows()), want);
  EXPECT_DOUBLE_EQ(c->flops({{{8, 64}}, {{64, 128}}}, {{{8, 128}}}), 2.0 * 8 * 64 * 128);
}

TEST(RulesMatmul, AddmmBiasFollowsOutputAndMustBePartialWithPartialOutput) {
  auto c = make_case("aten.addmm.default", {{{192}}, {{32, 64}}, {{64, 192}}}, "[$0, $1, $2]", {{{32, 192}}});
  std::set<std::string> want = {"S(0)|R,S(0),R",          "S(1)|S(0),R,S(1)",       "P(sum)|P(sum),S(1),S(0)",
                                "P(sum)|P(sum),P(sum),R", "P(sum)|P(sum),R,P(sum)", "P(avg)|P(avg),P(avg),R",
                                "P(avg)|P(avg),R,P(avg)"};
  EXPECT_EQ(row_set(c->rows()), want);
  EXPECT_DOUBLE_EQ(c->flops({{{192}}, {{32, 64}}, {{64, 192}}}, {{{32, 192}}}), 2.0 * 32 * 64 * 192);
}

TEST(RulesMatmul, BmmRowsIncludeBatch) {
  auto c = make_case("aten.bmm.default", {{{8, 16, 4}}, {{8, 4, 16}}}, "[$0, $1]", {{{8, 16, 16}}});
  auto rows = row_set(c->rows());
  EXPECT_TRUE(rows.count("S(0)|S(0),S(0)"));
  EXPECT_TRUE(rows.count("S(1)|S(1),R"));
  EXPECT_TRUE(rows.count("S(2)|R,S(2)"));
  EXPECT_TRUE(rows.count("P(sum)|S(2),S(1)"));
  EXPECT_EQ(rows.size(), 8u);
  EXPECT_DOUBLE_EQ(c->flops({{{8, 16, 4}}, {{8, 4, 16}}}, {{{8, 16, 16}}}), 2.0 * 8 * 16 * 4 * 16);
}

// ---- numeric check of the mm rows on a simulated 1-D mesh --------------------------------
using Mat = std::vector<std::vector<double>>;

Mat matmul(const Mat& a, const Mat& b) {
  Mat c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}
// torch.chunk semantics: chunk size ceil(n / ranks), trailing ranks may be short or empty.
std::pair<size_t, size_t> chunk(size_t n, int ranks, int r) {
  size_t c = (n + ranks - 1) / ranks;
  size_t lo = std::min(n, c * r), hi = std::min(n, c * (r + 1));
  return {lo, hi};
}
Mat local(const Mat& m, const Placement& p, int ranks, int r) {
  if (p.is_replicate()) return m;
  if (p.is_partial()) {  // an asymmetric split of the value (sum) or the value itself (avg/max/min)
    Mat out = m;
    for (auto& row : out)
      for (auto& v : row) v = p.reduce == ReduceOp::Sum ? v * (r == 0 ? 0.7 : 0.3 / (ranks - 1)) : v;
    return out;
  }
  if (p.dim == 0) {
    auto [lo, hi] = chunk(m.size(), ranks, r);
    return Mat(m.begin() + lo, m.begin() + hi);
  }
  auto [lo, hi] = chunk(m[0].size(), ranks, r);
  Mat out;
  for (const auto& row : m) out.emplace_back(row.begin() + lo, row.begin() + hi);
  return out;
}
// Reassembles per-rank outputs under placement p into the global matrix.
Mat assemble(const std::vector<Mat>& parts, const Placement& p, size_t rows, size_t cols) {
  Mat g(rows, std::vector<double>(cols, 0.0));
  int ranks = static_cast<int>(parts.size());
  for (int r = 0; r < ranks; ++r) {
    const Mat& m = parts[r];
    if (p.is_replicate()) return m;
    if (p.is_partial()) {
      for (size_t i = 0; i < rows; ++i)
        for (size_t j = 0; j < cols; ++j) g[i][j] += p.reduce == ReduceOp::Avg ? m[i][j] / ranks : m[i][j];
      continue;
    }
    auto [lo, hi] = chunk(p.dim == 0 ? rows : cols, ranks, r);
    for (size_t i = 0; i < m.size(); ++i)
      for (size_t j = 0; j < (m.empty() ? 0 : m[0].size()); ++j)
        g[p.dim == 0 ? lo + i : i][p.dim == 0 ? j : lo + j] = m[i][j];
    (void)hi;
  }
  return g;
}

TEST(RulesMatmul, EveryMmRowIsNumericallyExactOnUnevenShapes) {
  const size_t M = 5, K = 7, N = 3;  // uneven over 3 ranks
  const int ranks = 3;
  Mat a(M, std::vector<double>(K)), b(K, std::vector<double>(N));
  for (size_t i = 0; i < M; ++i)
    for (size_t k = 0; k < K; ++k) a[i][k] = std::sin(1.0 + i * 7 + k) * 3;
  for (size_t k = 0; k < K; ++k)
    for (size_t j = 0; j < N; ++j) b[k][j] = std::cos(2.0 + k * 3 + j) * 2;
  const Mat want = matmul(a, b);
  auto c = make_case("aten.mm.default", {{{int64_t(M), int64_t(K)}}, {{int64_t(K), int64_t(N)}}}, "[$0, $1]",
                     {{{int64_t(M), int64_t(N)}}}, "{}", {ranks});
  for (const auto& row : c->rows()) {
    std::vector<Mat> parts;
    for (int r = 0; r < ranks; ++r) {
      Mat la = local(a, row.inputs[0], ranks, r), lb = local(b, row.inputs[1], ranks, r);
      if (la.empty() || lb.empty() || la[0].empty()) {
        parts.push_back(Mat(la.size(), std::vector<double>(lb.empty() ? 0 : lb[0].size(), 0.0)));
        continue;
      }
      parts.push_back(matmul(la, lb));
    }
    Mat got = assemble(parts, row.outputs[0], M, N);
    for (size_t i = 0; i < M; ++i)
      for (size_t j = 0; j < N; ++j) ASSERT_NEAR(got[i][j], want[i][j], 1e-9) << row_str(row);
  }
}

}  // namespace
}  // namespace autoshard::testing_rules
