// View rules: dim mapping through reshape groups, the divisibility check, permutations and
// broadcasting.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

const std::set<std::string> kAllPartials = {"P(sum)|P(sum)", "P(avg)|P(avg)", "P(max)|P(max)", "P(min)|P(min)"};

std::set<std::string> with_partials(std::set<std::string> s) {
  s.insert(kAllPartials.begin(), kAllPartials.end());
  return s;
}

TEST(RulesViews, SplitHeadsMapsLeadingDimOfTheSplit) {
  // [B,T,H*D] -> [B,T,H,D]: B->B, T->T, H*D -> (H, D) keeps a shard only on H.
  auto c = make_case("aten.view.default", {{{2, 16, 64}}}, "[$0, [2, 16, 4, 16]]", {{{2, 16, 4, 16}}});
  EXPECT_EQ(row_set(c->rows()), with_partials({"S(0)|S(0)", "S(1)|S(1)", "S(2)|S(2)"}));
  EXPECT_TRUE(c->is_view_rule());
}

TEST(RulesViews, SplitNeedsTheLeadingSizeToDivide) {
  auto c = make_case("aten.view.default", {{{2, 16, 64}}}, "[$0, [2, 16, 4, 16]]", {{{2, 16, 4, 16}}}, "{}", {4});
  EXPECT_TRUE(c->accept({L({"S(2)"})}, {L({"S(2)"})}));  // 4 heads over 4 ranks
  auto c3 = make_case("aten.view.default", {{{2, 16, 48}}}, "[$0, [2, 16, 3, 16]]", {{{2, 16, 3, 16}}}, "{}", {2});
  EXPECT_FALSE(c3->accept({L({"S(2)"})}, {L({"S(2)"})}));  // 3 heads over 2 ranks: blocks misalign
  // A 1:1 group accepts uneven shards: chunks of equal dims line up.
  EXPECT_TRUE(c3->accept({L({"S(1)"})}, {L({"S(1)"})}));
  auto c33 = make_case("aten.view.default", {{{3, 48}}}, "[$0, [3, 3, 16]]", {{{3, 3, 16}}}, "{}", {2});
  EXPECT_TRUE(c33->accept({L({"S(0)"})}, {L({"S(0)"})}));
}

TEST(RulesViews, MergeKeepsOnlyTheFirstDim) {
  // [B,T,D] -> [B*T, D]: shard on B survives as S(0); a shard on T cannot (it would be strided).
  auto c = make_case("aten.view.default", {{{2, 16, 64}}}, "[$0, [32, 64]]", {{{32, 64}}}, "{}", {2, 2});
  EXPECT_EQ(row_set(c->rows()), with_partials({"S(0)|S(0)", "S(1)|S(2)"}));
  EXPECT_TRUE(c->accept({L({"S(0)", "R"})}, {L({"S(0)", "R"})}));
  EXPECT_FALSE(c->accept({L({"S(0)", "S(0)"})}, {L({"S(0)", "S(0)"})}));  // B=2 over 4 shards
}

TEST(RulesViews, SingletonDimsAppearAndVanish) {
  // sum's keepdim result [1,64] -> [64]
  auto c = make_case("aten.view.default", {{{1, 64}}}, "[$0, [64]]", {{{64}}});
  EXPECT_EQ(row_set(c->rows()), with_partials({"S(0)|S(1)"}));
  auto u = make_case("aten.unsqueeze.default", {{{16}, "int64"}}, "[$0, 0]", {{{1, 16}, "int64"}});
  EXPECT_EQ(row_set(u->rows()), with_partials({"S(1)|S(0)"}));
}

TEST(RulesViews, TransposePermuteAndT) {
  auto t = make_case("aten.transpose.int", {{{2, 16, 4, 16}}}, "[$0, 1, 2]", {{{2, 4, 16, 16}}});
  EXPECT_EQ(row_set(t->rows()), with_partials({"S(0)|S(0)", "S(1)|S(2)", "S(2)|S(1)", "S(3)|S(3)"}));
  auto p = make_case("aten.permute.default", {{{2, 3, 4}}}, "[$0, [2, 0, 1]]", {{{4, 2, 3}}});
  EXPECT_EQ(row_set(p->rows()), with_partials({"S(0)|S(2)", "S(1)|S(0)", "S(2)|S(1)"}));
  auto tt = make_case("aten.t.default", {{{64, 32}}}, "[$0]", {{{32, 64}}});
  EXPECT_EQ(row_set(tt->rows()), with_partials({"S(0)|S(1)", "S(1)|S(0)"}));
}

TEST(RulesViews, ExpandNeverShardsABroadcastDim) {
  auto c = make_case("aten.expand.default", {{{2, 16, 1}}}, "[$0, [2, 16, 64]]", {{{2, 16, 64}}});
  EXPECT_EQ(row_set(c->rows()), with_partials({"S(0)|S(0)", "S(1)|S(1)"}));
  auto s = make_case("aten.expand.default", {{{}}}, "[$0, [8, 16]]", {{{8, 16}}});
  EXPECT_EQ(row_set(s->rows()), kAllPartials);
}

TEST(RulesViews, SqueezeDropsOnlySizeOneDims) {
  auto c = make_case("aten.squeeze.dim", {{{4, 1, 8}}}, "[$0, 1]", {{{4, 8}}});
  EXPECT_EQ(row_set(c->rows()), with_partials({"S(0)|S(0)", "S(1)|S(2)"}));
}

}  // namespace
}  // namespace autoshard::testing_rules
