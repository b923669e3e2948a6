// Pointwise rules: broadcasting shard rows and the Partial rows per op class.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesPointwise, AddWithBroadcastShardsOnlyNonBroadcastDims) {
  // add(x[2,16,64], b[64]): dim 2 of the output reads b's dim 0; dims 0,1 broadcast b.
  auto c = make_case("aten.add.Tensor", {{{2, 16, 64}}, {{64}}}, "[$0, $1]", {{{2, 16, 64}}});
  std::set<std::string> want = {"S(0)|S(0),R",          "S(1)|S(1),R",          "S(2)|S(2),S(0)",
                                "P(sum)|P(sum),P(sum)", "P(avg)|P(avg),P(avg)", "P(avg)|P(avg),R",
                                "P(max)|P(max),R",      "P(min)|P(min),R",      "P(avg)|R,P(avg)"};
  EXPECT_EQ(row_set(c->rows()), want);
}

TEST(RulesPointwise, SizeOneDimIsBroadcastNotSharded) {
  // mul(x[2,16,64], rstd[2,16,1]): sharding dim 2 leaves rstd replicated.
  auto c = make_case("aten.mul.Tensor", {{{2, 16, 64}}, {{2, 16, 1}}}, "[$0, $1]", {{{2, 16, 64}}});
  auto rows = row_set(c->rows());
  EXPECT_TRUE(rows.count("S(2)|S(2),R"));
  EXPECT_TRUE(rows.count("S(1)|S(1),S(1)"));
  EXPECT_TRUE(rows.count("P(sum)|P(sum),R"));
  EXPECT_TRUE(rows.count("P(sum)|R,P(sum)"));
  EXPECT_FALSE(rows.count("P(sum)|P(sum),P(sum)"));  // a product of two partial sums is not partial
  EXPECT_FALSE(rows.count("P(max)|P(max),R"));       // the R factor may be negative
}

TEST(RulesPointwise, AddOfPythonNumberKeepsNoPartial) {
  // add(x, 1e-6): P(sum)+c would add c once per rank (DTensor issue #163193).
  auto c = make_case("aten.add.Tensor", {{{2, 16, 1}}}, "[$0, 1e-06]", {{{2, 16, 1}}});
  for (const auto& r : c->rows()) EXPECT_FALSE(r.inputs[0].is_partial()) << row_str(r);
  EXPECT_EQ(c->rows().size(), 3u);
}

TEST(RulesPointwise, ScalarMulAndDivAreLinear) {
  auto c = make_case("aten.mul.Scalar", {{{4, 8}}}, "[$0, -0.5]", {{{4, 8}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0)|S(0)", "S(1)|S(1)", "P(sum)|P(sum)", "P(avg)|P(avg)"}));
  auto d = make_case("aten.div.Tensor", {{{4, 8}}, {{4, 1}}}, "[$0, $1]", {{{4, 8}}});
  auto rows = row_set(d->rows());
  EXPECT_TRUE(rows.count("P(sum)|P(sum),R"));
  EXPECT_FALSE(rows.count("P(sum)|R,P(sum)"));  // 1/(a+b) != 1/a + 1/b
}

TEST(RulesPointwise, NegSwapsMaxAndMin) {
  auto c = make_case("aten.neg.default", {{{4}}}, "[$0]", {{{4}}});
  auto rows = row_set(c->rows());
  EXPECT_TRUE(rows.count("P(min)|P(max)"));
  EXPECT_TRUE(rows.count("P(max)|P(min)"));
  EXPECT_FALSE(rows.count("P(max)|P(max)"));
}

TEST(RulesPointwise, NonlinearOpsHaveOnlyShardRows) {
  for (const char* op : {"aten.silu.default", "aten.rsqrt.default", "aten.gelu.default"}) {
    auto c = make_case(op, {{{3, 5}}}, "[$0]", {{{3, 5}}});
    EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0)|S(0)", "S(1)|S(1)"})) << op;
  }
  auto e = make_case("aten.exp.default", {{{3}}}, "[$0]", {{{3}}});
  EXPECT_EQ(row_set(e->rows()), (std::set<std::string>{"S(0)|S(0)", "P(max)|P(max)", "P(min)|P(min)"}));
}

TEST(RulesPointwise, NoPartialSumThroughCastToIntOrBool) {
  auto to_int =
      make_case("aten._to_copy.default", {{{8}}}, "[$0]", {{{8}, "int64"}}, R"({"dtype": {"dtype": "int64"}})");
  EXPECT_EQ(row_set(to_int->rows()), (std::set<std::string>{"S(0)|S(0)", "P(max)|P(max)", "P(min)|P(min)"}));
  auto to_bool =
      make_case("aten._to_copy.default", {{{8}}}, "[$0]", {{{8}, "bool"}}, R"({"dtype": {"dtype": "bool"}})");
  EXPECT_EQ(row_set(to_bool->rows()), (std::set<std::string>{"S(0)|S(0)"}));
  auto to_bf16 =
      make_case("aten._to_copy.default", {{{8}}}, "[$0]", {{{8}, "bfloat16"}}, R"({"dtype": {"dtype": "bfloat16"}})");
  EXPECT_EQ(row_set(to_bf16->rows()),
            (std::set<std::string>{"S(0)|S(0)", "P(sum)|P(sum)", "P(avg)|P(avg)", "P(max)|P(max)", "P(min)|P(min)"}));
  auto int_to_float = make_case("aten._to_copy.default", {{{8}, "int64"}}, "[$0]", {{{8}, "float32"}},
                                R"({"dtype": {"dtype": "float32"}})");
  EXPECT_TRUE(row_set(int_to_float->rows()).count("P(sum)|P(sum)"));
}

TEST(RulesPointwise, WhereBroadcastsItsScalarOperands) {
  auto c = make_case("aten.where.self", {{{16, 16}, "bool"}, {{}}, {{}}}, "[$0, $1, $2]", {{{16, 16}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0)|S(0),R,R", "S(1)|S(1),R,R"}));
}

TEST(RulesPointwise, DropoutShardsBothOutputsAndNeverPartial) {
  auto c = make_case("aten.native_dropout.default", {{{2, 16, 64}}}, "[$0, 0.1, true]",
                     {{{2, 16, 64}}, {{2, 16, 64}, "bool"}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0),S(0)|S(0)", "S(1),S(1)|S(1)", "S(2),S(2)|S(2)"}));
}

TEST(RulesPointwise, IdentityCopiesKeepEveryPartial) {
  auto c = make_case("aten.clone.default", {{{4, 4}}}, "[$0]", {{{4, 4}}});
  auto rows = row_set(c->rows());
  for (const char* p : {"P(sum)|P(sum)", "P(avg)|P(avg)", "P(max)|P(max)", "P(min)|P(min)"})
    EXPECT_TRUE(rows.count(p)) << p;
}

}  // namespace
}  // namespace autoshard::testing_rules
