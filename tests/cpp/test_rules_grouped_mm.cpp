// Grouped matmul rules (cpp/src/rules/grouped_mm.cpp): the four layouts of aten._grouped_mm,
// the 16-byte alignment check, transformers' fallback op and its backward, FLOPs.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

const std::set<std::string> kLinear2 = {"P(sum)|P(sum),R,R", "P(sum)|R,P(sum),R", "P(avg)|P(avg),R,R",
                                        "P(avg)|R,P(avg),R"};

std::set<std::string> with_linear(std::set<std::string> s) {
  s.insert(kLinear2.begin(), kLinear2.end());
  return s;
}

TEST(RulesGroupedMm, TwoDByThreeDNeverShardsTheGroupedRows) {
  auto c = make_case("aten._grouped_mm.default", {{{256, 64}, "bfloat16"}, {{4, 64, 128}, "bfloat16"}, {{4}, "int32"}},
                     "[$0, $1, $2]", {{{256, 128}, "bfloat16"}});
  EXPECT_EQ(row_set(c->rows()), with_linear({"S(1)|R,S(2),R", "P(sum)|S(1),S(1),R"}));
  EXPECT_DOUBLE_EQ(c->flops({{{256, 64}}, {{4, 64, 128}}, {{4}}}, {{{256, 128}}}), 2.0 * 256 * 64 * 128);
}

TEST(RulesGroupedMm, TwoDByTwoDGroupsTheContraction) {
  // the weight gradient: input^T [64, 256] x grad [256, 128] grouped along 256 -> [4, 64, 128]
  auto c = make_case("aten._grouped_mm.default", {{{64, 256}, "bfloat16"}, {{256, 128}, "bfloat16"}, {{4}, "int32"}},
                     "[$0, $1, $2]", {{{4, 64, 128}, "bfloat16"}});
  EXPECT_EQ(row_set(c->rows()), with_linear({"S(1)|S(0),R,R", "S(2)|R,S(1),R"}));
  EXPECT_DOUBLE_EQ(c->flops({{{64, 256}}, {{256, 128}}, {{4}}}, {{{4, 64, 128}}}), 2.0 * 64 * 256 * 128);
}

TEST(RulesGroupedMm, ThreeDLayouts) {
  auto c32 = make_case("aten._grouped_mm.default", {{{4, 32, 64}, "bfloat16"}, {{64, 128}, "bfloat16"}, {{4}, "int32"}},
                       "[$0, $1, $2]", {{{32, 128}, "bfloat16"}});
  EXPECT_EQ(row_set(c32->rows()), with_linear({"S(0)|S(1),R,R", "P(sum)|S(2),S(0),R"}));
  auto c33 = make_case("aten._grouped_mm.default", {{{4, 32, 64}, "bfloat16"}, {{4, 64, 16}, "bfloat16"}}, "[$0, $1]",
                       {{{4, 32, 16}, "bfloat16"}});
  EXPECT_EQ(row_set(c33->rows()),
            (std::set<std::string>{"S(0)|S(0),S(0)", "S(1)|S(1),R", "S(2)|R,S(2)", "P(sum)|S(2),S(1)",
                                   "P(sum)|P(sum),R", "P(sum)|R,P(sum)", "P(avg)|P(avg),R", "P(avg)|R,P(avg)"}));
}

TEST(RulesGroupedMm, ShardedMatrixDimsKeepSixteenByteBlocks) {
  // bf16: 8 elements per 16 bytes. K = 64 over 4 ranks: 16 each (aligned); over 16: 4 (not).
  auto c = make_case("aten._grouped_mm.default", {{{256, 64}, "bfloat16"}, {{4, 64, 128}, "bfloat16"}, {{4}, "int32"}},
                     "[$0, $1, $2]", {{{256, 128}, "bfloat16"}}, "{}", {4, 4});
  EXPECT_TRUE(c->accept({L({"P(sum)", "R"})}, {L({"S(1)", "R"}), L({"S(1)", "R"}), L({"R", "R"})}));
  EXPECT_FALSE(c->accept({L({"P(sum)", "P(sum)"})}, {L({"S(1)", "S(1)"}), L({"S(1)", "S(1)"}), L({"R", "R"})}));
  // N = 128 over 16 ranks: 8 each (aligned)
  EXPECT_TRUE(c->accept({L({"S(1)", "S(1)"})}, {L({"R", "R"}), L({"S(2)", "S(2)"}), L({"R", "R"})}));
}

TEST(RulesGroupedMm, TransformersFallbackAndItsBackward) {
  auto f = make_case("transformers.grouped_mm_fallback.default", {{{256, 64}}, {{4, 64, 32}}, {{4}, "int32"}},
                     "[$0, $1, $2]", {{{256, 32}}});
  EXPECT_EQ(row_set(f->rows()), with_linear({"S(1)|R,S(2),R", "P(sum)|S(1),S(1),R"}));
  EXPECT_TRUE(f->accept({L({"S(1)"})}, {L({"R"}), L({"S(2)"}), L({"R"})}));
  auto b = make_case("transformers.grouped_mm_fallback_backward.default",
                     {{{256, 64}}, {{4, 64, 32}}, {{4}, "int32"}, {{256, 32}}}, "[$0, $1, $2, $3]",
                     {{{256, 64}}, {{4, 64, 32}}});
  std::set<std::string> want = {"P(sum),S(2)|R,S(2),R,S(1)", "S(1),S(1)|S(1),S(1),R,R", "P(sum),P(sum)|R,R,R,P(sum)",
                                "R,P(sum)|P(sum),R,R,R",     "P(sum),R|R,P(sum),R,R",   "P(avg),P(avg)|R,R,R,P(avg)",
                                "R,P(avg)|P(avg),R,R,R",     "P(avg),R|R,P(avg),R,R"};
  EXPECT_EQ(row_set(b->rows()), want);
  EXPECT_DOUBLE_EQ(b->flops({{{256, 64}}, {{4, 64, 32}}, {{4}}, {{256, 32}}}, {{{256, 64}}, {{4, 64, 32}}}),
                   2 * 2.0 * 256 * 64 * 32);
}

}  // namespace
}  // namespace autoshard::testing_rules
