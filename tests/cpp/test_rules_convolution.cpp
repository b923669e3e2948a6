// Convolution rules (cpp/src/rules/convolution.cpp): rows for 1-D/2-D/3-D, grouped and
// transposed convolutions and their backward, the window check of spatial shards, FLOPs.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

// conv2d x[8,3,32,32] * w[64,3,3,3] + b[64], stride 1, padding 1 -> [8,64,32,32]
std::unique_ptr<OpCase> conv2d(int64_t groups = 1, std::vector<int64_t> mesh = {4}) {
  const int64_t cin = 4;
  return make_case("aten.convolution.default", {{{8, cin, 32, 32}}, {{64, cin / groups, 3, 3}}, {{64}}},
                   "[$0, $1, $2, [1, 1], [1, 1], [1, 1], false, [0, 0], " + std::to_string(groups) + "]",
                   {{{8, 64, 32, 32}}}, "{}", mesh);
}

TEST(RulesConvolution, Conv2dRowsBatchChannelsAndLinear) {
  std::set<std::string> want = {"S(0)|S(0),R,R",          "S(1)|R,S(0),S(0)",       "P(sum)|S(1),S(1),P(sum)",
                                "P(sum)|P(sum),R,P(sum)", "P(sum)|R,P(sum),P(sum)", "P(avg)|P(avg),R,P(avg)",
                                "P(avg)|R,P(avg),P(avg)"};
  EXPECT_EQ(row_set(conv2d()->rows()), want);
}

TEST(RulesConvolution, GroupedConvKeepsOnlyBatchAndPartialRows) {
  auto rows = row_set(conv2d(2)->rows());
  EXPECT_TRUE(rows.count("S(0)|S(0),R,R"));
  EXPECT_FALSE(rows.count("S(1)|R,S(0),S(0)"));
  EXPECT_FALSE(rows.count("P(sum)|S(1),S(1),P(sum)"));
  EXPECT_EQ(rows.size(), 5u);
}

TEST(RulesConvolution, Conv1dAnd3dWithoutBias) {
  auto c1 = make_case("aten.convolution.default", {{{4, 8, 20}}, {{16, 8, 5}}},
                      "[$0, $1, null, [2], [0], [1], false, [0], 1]", {{{4, 16, 8}}});
  auto rows = row_set(c1->rows());
  EXPECT_TRUE(rows.count("S(0)|S(0),R"));
  EXPECT_TRUE(rows.count("S(1)|R,S(0)"));
  EXPECT_TRUE(rows.count("P(sum)|S(1),S(1)"));
  EXPECT_FALSE(rows.count("S(2)|S(2),R"));  // windows of 5 at stride 2 overlap
  auto c3 = make_case("aten.convolution.default", {{{2, 4, 8, 8, 8}}, {{8, 4, 2, 2, 2}}},
                      "[$0, $1, null, [2, 2, 2], [0, 0, 0], [1, 1, 1], false, [0, 0, 0], 1]", {{{2, 8, 4, 4, 4}}});
  rows = row_set(c3->rows());
  for (const char* r : {"S(2)|S(2),R", "S(3)|S(3),R", "S(4)|S(4),R"}) EXPECT_TRUE(rows.count(r)) << r;
  EXPECT_DOUBLE_EQ(c3->flops({{{2, 4, 8, 8, 8}}, {{8, 4, 2, 2, 2}}}, {{{2, 8, 4, 4, 4}}}),
                   2.0 * (2 * 8 * 64) * (4 * 8));
}

TEST(RulesConvolution, PatchEmbeddingShardsWholeWindowsOnly) {
  // ViT patch embedding: kernel = stride = 8 on a 32x32 image
  auto c = make_case("aten.convolution.default", {{{8, 3, 32, 32}}, {{64, 3, 8, 8}}, {{64}}},
                     "[$0, $1, $2, [8, 8], [0, 0], [1, 1], false, [0, 0], 1]", {{{8, 64, 4, 4}}}, "{}", {4});
  auto rows = row_set(c->rows());
  EXPECT_TRUE(rows.count("S(2)|S(2),R,R"));
  EXPECT_TRUE(rows.count("S(3)|S(3),R,R"));
  // 32 rows over 4 ranks: 8 each, one window per rank
  EXPECT_TRUE(c->accept({L({"S(2)"})}, {L({"S(2)"}), L({"R"}), L({"R"})}));
  // 24 rows over 4 ranks would split a window: rejected
  auto odd = make_case("aten.convolution.default", {{{8, 3, 24, 24}}, {{64, 3, 8, 8}}, {{64}}},
                       "[$0, $1, $2, [8, 8], [0, 0], [1, 1], false, [0, 0], 1]", {{{8, 64, 3, 3}}}, "{}", {4});
  EXPECT_FALSE(odd->accept({L({"S(2)"})}, {L({"S(2)"}), L({"R"}), L({"R"})}));
  EXPECT_TRUE(odd->accept({L({"S(0)"})}, {L({"S(0)"}), L({"R"}), L({"R"})}));
}

TEST(RulesConvolution, TransposedConvUsesTheTransposedWeightLayout) {
  // conv_transpose1d: w [Cin=8, Cout=16, 3]
  auto c = make_case("aten.convolution.default", {{{4, 8, 10}}, {{8, 16, 3}}, {{16}}},
                     "[$0, $1, $2, [2], [1], [1], true, [1], 1]", {{{4, 16, 20}}});
  auto rows = row_set(c->rows());
  EXPECT_TRUE(rows.count("S(1)|R,S(1),S(0)"));
  EXPECT_TRUE(rows.count("P(sum)|S(1),S(0),P(sum)"));
  EXPECT_FALSE(rows.count("S(2)|S(2),R,R"));
  // one product per input element: 2 * (4*8*10) * (16*3)
  EXPECT_DOUBLE_EQ(c->flops({{{4, 8, 10}}, {{8, 16, 3}}, {{16}}}, {{{4, 16, 20}}}), 2.0 * 320 * 48);
}

TEST(RulesConvolution, BackwardRows) {
  auto c = make_case("aten.convolution_backward.default", {{{8, 64, 32, 32}}, {{8, 4, 32, 32}}, {{64, 4, 3, 3}}},
                     "[$0, $1, $2, [64], [1, 1], [1, 1], [1, 1], false, [0, 0], 1, [true, true, true]]",
                     {{{8, 4, 32, 32}}, {{64, 4, 3, 3}}, {{64}}});
  std::set<std::string> want = {
      "S(0),P(sum),P(sum)|S(0),S(0),R",  "P(sum),S(0),S(0)|S(1),R,S(0)", "S(1),S(1),R|R,S(1),S(1)",
      "P(sum),P(sum),P(sum)|P(sum),R,R", "R,P(sum),R|R,P(sum),R",        "P(sum),R,R|R,R,P(sum)",
      "P(avg),P(avg),P(avg)|P(avg),R,R", "R,P(avg),R|R,P(avg),R",        "P(avg),R,R|R,R,P(avg)"};
  EXPECT_EQ(row_set(c->rows()), want);
  // grad_input and grad_weight: two products of the forward's size
  EXPECT_DOUBLE_EQ(
      c->flops({{{8, 64, 32, 32}}, {{8, 4, 32, 32}}, {{64, 4, 3, 3}}}, {{{8, 4, 32, 32}}, {{64, 4, 3, 3}}, {{64}}}),
      2 * 2.0 * (8 * 64 * 32 * 32) * (4 * 9));
}

TEST(RulesConvolution, BackwardWithoutInputGradientAndPatchShards) {
  auto c = make_case("aten.convolution_backward.default", {{{8, 64, 4, 4}}, {{8, 3, 32, 32}}, {{64, 3, 8, 8}}},
                     "[$0, $1, $2, [64], [8, 8], [0, 0], [1, 1], false, [0, 0], 1, [false, true, true]]",
                     {{{}, ""}, {{64, 3, 8, 8}}, {{64}}});
  auto rows = row_set(c->rows());
  EXPECT_TRUE(rows.count("S(2),P(sum),P(sum)|S(2),S(2),R"));
  EXPECT_TRUE(rows.count("S(3),P(sum),P(sum)|S(3),S(3),R"));
  EXPECT_TRUE(c->accept({L({"R"}), L({"P(sum)"}), L({"P(sum)"})}, {L({"S(2)"}), L({"S(2)"}), L({"R"})}));
  // only grad_weight is computed: one product
  EXPECT_DOUBLE_EQ(c->flops({{{8, 64, 4, 4}}, {{8, 3, 32, 32}}, {{64, 3, 8, 8}}}, {{}, {{64, 3, 8, 8}}, {{64}}}),
                   2.0 * (8 * 64 * 16) * (3 * 64));
}

}  // namespace
}  // namespace autoshard::testing_rules
