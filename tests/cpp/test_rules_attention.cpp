// SDPA rules: batch / head rows, GQA acceptance, FLOPs.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesAttention, FlashCpuForwardBatchAndHeads) {
  auto c = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 4, 16, 16}}, {{2, 4, 16}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0),S(0)|S(0),S(0),S(0)", "S(1),S(1)|S(1),S(1),S(1)"}));
  EXPECT_DOUBLE_EQ(c->flops({{{2, 2, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}}, {}), 4.0 * 2 * 2 * 16 * 16 * 16);
}

TEST(RulesAttention, GqaHeadShardingNeedsBothHeadCountsToDivide) {
  // q has 4 heads, k/v 2 heads.
  auto c = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 4, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 4, 16, 16}}, {{2, 4, 16}}}, "{}", {2, 2});
  Layout h2 = L({"S(1)", "R"}), h4 = L({"S(1)", "S(1)"}), b = L({"S(0)", "R"});
  EXPECT_TRUE(c->accept({h2, h2}, {h2, h2, h2}));   // 4/2 q heads use 2/2 kv heads
  EXPECT_FALSE(c->accept({h4, h4}, {h4, h4, h4}));  // 2 kv heads cannot feed 4 ranks' q heads
  EXPECT_TRUE(c->accept({b, b}, {b, b, b}));
  // Equal head counts: uneven head chunks line up by themselves.
  auto e = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 3, 16, 16}}, {{2, 3, 16, 16}}, {{2, 3, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 3, 16, 16}}, {{2, 3, 16}}}, "{}", {2});
  Layout s = L({"S(1)"});
  EXPECT_TRUE(e->accept({s, s}, {s, s, s}));
}

TEST(RulesAttention, FlashCpuBackward) {
  auto c = make_case(
      "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
      {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16}}},
      "[$0, $1, $2, $3, $4, $5, 0.0, true]", {{{2, 4, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0),S(0),S(0)|S(0),S(0),S(0),S(0),S(0),S(0)",
                                                       "S(1),S(1),S(1)|S(1),S(1),S(1),S(1),S(1),S(1)"}));
  EXPECT_DOUBLE_EQ(c->flops({{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 2, 16, 16}}}, {}),
                   2.5 * 4.0 * 2 * 4 * 16 * 16 * 16);
}

TEST(RulesAttention, EfficientAttentionBiasAndPhiloxTensors) {
  // outputs: out, logsumexp, philox_seed, philox_offset (0-d)
  auto c = make_case("aten._scaled_dot_product_efficient_attention.default",
                     {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{1, 4, 16, 16}}}, "[$0, $1, $2, $3, true]",
                     {{{2, 4, 16, 8}}, {{2, 4, 32}}, {{}, "int64"}, {{}, "int64"}});
  EXPECT_EQ(row_set(c->rows()),
            (std::set<std::string>{"S(0),S(0),R,R|S(0),S(0),S(0),R", "S(1),S(1),R,R|S(1),S(1),S(1),S(1)"}));
}

}  // namespace
}  // namespace autoshard::testing_rules
