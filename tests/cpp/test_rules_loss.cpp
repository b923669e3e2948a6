// Elementwise loss rules (cpp/src/rules/loss.cpp): mse, smooth-l1, huber, binary cross-entropy
// (with and without logits) and their backwards, per reduction; mean's even-split check.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesLoss, MseForwardPerReduction) {
  auto none = make_case("aten.mse_loss.default", {{{8, 16}}, {{8, 16}}}, "[$0, $1, 0]", {{{8, 16}}});
  EXPECT_EQ(row_set(none->rows()), (std::set<std::string>{"S(0)|S(0),S(0)", "S(1)|S(1),S(1)"}));
  auto sum = make_case("aten.mse_loss.default", {{{8, 16}}, {{8, 16}}}, "[$0, $1, 2]", {{{}}});
  EXPECT_EQ(row_set(sum->rows()), (std::set<std::string>{"P(sum)|S(0),S(0)", "P(sum)|S(1),S(1)"}));
  auto mean = make_case("aten.mse_loss.default", {{{6, 16}}, {{6, 16}}}, "[$0, $1]", {{{}}});
  EXPECT_EQ(row_set(mean->rows()), (std::set<std::string>{"P(avg)|S(0),S(0)", "P(avg)|S(1),S(1)"}));
  // 6 rows over 4 ranks (2,2,2,0): local means would be averaged with the wrong weights
  EXPECT_FALSE(mean->accept({L({"P(avg)"})}, {L({"S(0)"}), L({"S(0)"})}));
  EXPECT_TRUE(mean->accept({L({"P(avg)"})}, {L({"S(1)"}), L({"S(1)"})}));
  EXPECT_TRUE(sum->accept({L({"P(sum)"})}, {L({"S(0)"}), L({"S(0)"})}));
}

TEST(RulesLoss, BceWithLogitsBroadcastsWeightAndPosWeight) {
  // logits [8, 4, 32], targets alike, weight [32], pos_weight [32]; mean
  auto c = make_case("aten.binary_cross_entropy_with_logits.default", {{{8, 4, 32}}, {{8, 4, 32}}, {{32}}, {{32}}},
                     "[$0, $1, $2, $3]", {{{}}});
  EXPECT_EQ(row_set(c->rows()),
            (std::set<std::string>{"P(avg)|S(0),S(0),R,R", "P(avg)|S(1),S(1),R,R", "P(avg)|S(2),S(2),S(0),S(0)"}));
  auto kw = make_case("aten.binary_cross_entropy_with_logits.default", {{{8, 32}}, {{8, 32}}}, "[$0, $1]", {{{}}},
                      R"({"reduction": 2})");
  EXPECT_TRUE(row_set(kw->rows()).count("P(sum)|S(0),S(0)"));
}

TEST(RulesLoss, BackwardShardsOnlyNoneAndSum) {
  auto sum = make_case("aten.smooth_l1_loss_backward.default", {{{}}, {{8, 16}}, {{8, 16}}}, "[$0, $1, $2, 2, 0.5]",
                       {{{8, 16}}});
  EXPECT_EQ(row_set(sum->rows()),
            (std::set<std::string>{"S(0)|R,S(0),S(0)", "S(1)|R,S(1),S(1)", "P(sum)|P(sum),R,R", "P(avg)|P(avg),R,R"}));
  auto none = make_case("aten.huber_loss_backward.default", {{{8, 16}}, {{8, 16}}, {{8, 16}}}, "[$0, $1, $2, 0, 1.0]",
                        {{{8, 16}}});
  EXPECT_TRUE(row_set(none->rows()).count("S(1)|S(1),S(1),S(1)"));
  // mean: the local kernel divides by the local count, so only the linear rows remain
  auto mean = make_case("aten.mse_loss_backward.default", {{{}}, {{8, 16}}, {{8, 16}}}, "[$0, $1, $2, 1]", {{{8, 16}}});
  EXPECT_EQ(row_set(mean->rows()), (std::set<std::string>{"P(sum)|P(sum),R,R", "P(avg)|P(avg),R,R"}));
  auto bce = make_case("aten.binary_cross_entropy_backward.default", {{{}}, {{8, 16}}, {{8, 16}}, {{16}}},
                       "[$0, $1, $2, $3, 2]", {{{8, 16}}});
  EXPECT_TRUE(row_set(bce->rows()).count("S(1)|R,S(1),S(1),S(0)"));
  EXPECT_TRUE(row_set(bce->rows()).count("S(0)|R,S(0),S(0),R"));
}

}  // namespace
}  // namespace autoshard::testing_rules
