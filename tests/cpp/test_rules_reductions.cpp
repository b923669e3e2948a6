// Reduction, softmax and norm rules.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesReductions, SumDimKeepdimAndPartial) {
  // sum(x[32,64], [0], keepdim=True) -> [1,64] (a bias gradient)
  auto c = make_case("aten.sum.dim_IntList", {{{32, 64}}}, "[$0, [0], true]", {{{1, 64}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"P(sum)|S(0)", "S(1)|S(1)", "P(sum)|P(sum)"}));
  // keepdim=False renumbers the kept dims
  auto d = make_case("aten.sum.dim_IntList", {{{2, 16, 64}}}, "[$0, [0, 1]]", {{{64}}});
  EXPECT_EQ(row_set(d->rows()), (std::set<std::string>{"P(sum)|S(0)", "P(sum)|S(1)", "S(0)|S(2)", "P(sum)|P(sum)"}));
}

TEST(RulesReductions, MeanIsAvgOnlyWithEvenShards) {
  auto c = make_case("aten.mean.dim", {{{2, 16, 64}}}, "[$0, [-1], true]", {{{2, 16, 1}}}, "{}", {4});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0)|S(0)", "S(1)|S(1)", "P(avg)|S(2)", "P(avg)|P(avg)"}));
  EXPECT_TRUE(c->accept({L({"P(avg)"})}, {L({"S(2)"})}));  // 64 / 4
  auto u = make_case("aten.mean.default", {{{6}}}, "[$0]", {{{}}}, "{}", {4});
  EXPECT_FALSE(u->accept({L({"P(avg)"})}, {L({"S(0)"})}));  // 6 over 4: chunks 2,2,2,0
  EXPECT_TRUE(u->accept({L({"P(avg)"})}, {L({"P(avg)"})}));
  // uneven sharding of a KEPT dim is fine
  auto k = make_case("aten.mean.dim", {{{6, 8}}}, "[$0, [1]]", {{{6}}}, "{}", {4});
  EXPECT_TRUE(k->accept({L({"S(0)"})}, {L({"S(0)"})}));
}

TEST(RulesReductions, AmaxGivesPartialMax) {
  auto c = make_case("aten.amax.default", {{{4, 8}}}, "[$0, [1], true]", {{{4, 1}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0)|S(0)", "P(max)|S(1)", "P(max)|P(max)"}));
  // 8 over 3 ranks chunks as 3,3,2: fine; 4 over 3 gives an empty block, whose max is undefined.
  auto u = make_case("aten.amax.default", {{{4, 8}}}, "[$0, [1], true]", {{{4, 1}}}, "{}", {3});
  EXPECT_TRUE(u->accept({L({"P(max)"})}, {L({"S(1)"})}));
  EXPECT_FALSE(u->accept({L({"S(0)"})}, {L({"S(0)"})}));
}

TEST(RulesReductions, TopkAndSortShardOnlyOtherDims) {
  auto c = make_case("aten.topk.default", {{{16, 4}}}, "[$0, 2]", {{{16, 2}}, {{16, 2}, "int64"}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0),S(0)|S(0)"}));
  auto s = make_case("aten.sort.default", {{{32}, "int64"}}, "[$0]", {{{32}, "int64"}, {{32}, "int64"}});
  EXPECT_TRUE(s->rows().empty());
}

TEST(RulesReductions, SoftmaxFamily) {
  auto c = make_case("aten._log_softmax.default", {{{32, 100}}}, "[$0, 1, false]", {{{32, 100}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0)|S(0)"}));
  auto b = make_case("aten._softmax_backward_data.default", {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}},
                     R"([$0, $1, -1, {"dtype": "float32"}])", {{{2, 4, 16, 16}}});
  EXPECT_EQ(row_set(b->rows()), (std::set<std::string>{"S(0)|S(0),S(0)", "S(1)|S(1),S(1)", "S(2)|S(2),S(2)"}));
}

TEST(RulesNorms, LayerNormForwardAndBackward) {
  auto f = make_case("aten.native_layer_norm.default", {{{2, 16, 64}}, {{64}}, {{64}}}, "[$0, [64], $1, $2, 1e-05]",
                     {{{2, 16, 64}}, {{2, 16, 1}}, {{2, 16, 1}}});
  EXPECT_EQ(row_set(f->rows()), (std::set<std::string>{"S(0),S(0),S(0)|S(0),R,R", "S(1),S(1),S(1)|S(1),R,R"}));
  auto b = make_case("aten.native_layer_norm_backward.default",
                     {{{2, 16, 64}}, {{2, 16, 64}}, {{2, 16, 1}}, {{2, 16, 1}}, {{64}}, {{64}}},
                     "[$0, $1, [64], $2, $3, $4, $5, [true, true, true]]", {{{2, 16, 64}}, {{64}}, {{64}}});
  EXPECT_EQ(row_set(b->rows()), (std::set<std::string>{"S(0),P(sum),P(sum)|S(0),S(0),S(0),S(0),R,R",
                                                       "S(1),P(sum),P(sum)|S(1),S(1),S(1),S(1),R,R"}));
}

}  // namespace
}  // namespace autoshard::testing_rules
