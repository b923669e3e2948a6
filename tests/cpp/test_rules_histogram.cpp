// Histogram rules (cpp/src/rules/histogram.cpp): histc with a fixed range counts any split of
// its input (partial sums); without a range, and bincount, stay replicated.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesHistogram, HistcWithRangeGivesPartialCounts) {
  auto c = make_case("aten.histc.default", {{{16, 8}}}, "[$0, 4, 0, 3]", {{{4}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"P(sum)|S(0)", "P(sum)|S(1)"}));
  EXPECT_FALSE(c->is_view_rule());
}

TEST(RulesHistogram, HistcWithoutRangeIsReplicateOnly) {
  EXPECT_TRUE(make_case("aten.histc.default", {{{16}}}, "[$0, 4]", {{{4}}})->rows().empty());
  EXPECT_TRUE(make_case("aten.histc.default", {{{16}}}, "[$0, 4, 1.5, 1.5]", {{{4}}})->rows().empty());
  EXPECT_EQ(row_set(make_case("aten.histc.default", {{{16}}}, "[$0]", {{{100}}}, R"({"min": 0, "max": 8})")->rows()),
            (std::set<std::string>{"P(sum)|S(0)"}));
}

TEST(RulesHistogram, BincountIsReplicateOnly) {
  EXPECT_TRUE(make_case("aten.bincount.default", {{{16}, "int64"}}, "[$0, null, 4]", {{{4}, "int64"}})->rows().empty());
  EXPECT_TRUE(
      make_case("aten.bincount.default", {{{16}, "int64"}, {{16}}}, "[$0, $1]", {{{9}, "float64"}})->rows().empty());
}

}  // namespace
}  // namespace autoshard::testing_rules
