// Uneven shards are kept through ops that leave every tensor where it is (pointwise on equal
// shapes, casts): the enumerator must offer S(0) for 3 rows on 4 ranks there, while ops that
// move data across the shard (a matmul contracting it, a broadcasting add) keep DTensor's
// shardability (every rank gets data).
#include "autoshard/layout.h"
#include "autoshard/strategy.h"
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

std::set<std::string> strategies(const OpCase& c, const std::vector<int64_t>& mesh_shape) {
  MeshModel model = MeshModel::make(Mesh{mesh_shape, {}}, "H100");
  std::set<std::string> out;
  for (const auto& s : enumerate_node_strategies(c.graph, c.node, model)) out.insert(strategy_str(s));
  return out;
}

TEST(RulesUneven, PointwiseAndCastsKeepAnUnevenShard) {
  auto relu = make_case("aten.relu.default", {{{3, 8}}}, "[$0]", {{{3, 8}}});
  auto s = strategies(*relu, {4});
  EXPECT_TRUE(s.count("S(0) -> S(0)"));  // 3 rows over 4 ranks: sizes 1, 1, 1, 0
  EXPECT_TRUE(s.count("S(1) -> S(1)"));
  auto cast = make_case("aten._to_copy.default", {{{3, 8}}}, "[$0]", {{{3, 8}, "bfloat16"}},
                        R"({"dtype": {"dtype": "bfloat16"}})");
  EXPECT_TRUE(strategies(*cast, {4}).count("S(0) -> S(0)"));
  auto mul = make_case("aten.mul.Tensor", {{{3, 8}}, {{3, 8}}}, "[$0, $1]", {{{3, 8}}});
  EXPECT_TRUE(strategies(*mul, {4}).count("S(0),S(0) -> S(0)"));
  EXPECT_TRUE(strategies(*mul, {2, 4}).count("S(1)S(0),S(1)S(0) -> S(1)S(0)"));
}

TEST(RulesUneven, OpsThatChangeShapesKeepDTensorShardability) {
  // x[3,8] @ w[8,5]: S(0) on x gives an output shard of a different tensor (same rows, but
  // the layouts are not "kept" as a whole), so the strict check applies.
  auto mm = make_case("aten.mm.default", {{{3, 8}}, {{8, 5}}}, "[$0, $1]", {{{3, 5}}});
  for (const auto& s : strategies(*mm, {4})) EXPECT_EQ(s.find("S(0),R -> S(0)"), std::string::npos) << s;
  // broadcasting add [3,8] + [8]: input shapes differ
  auto add = make_case("aten.add.Tensor", {{{3, 8}}, {{8}}}, "[$0, $1]", {{{3, 8}}});
  for (const auto& s : strategies(*add, {4})) EXPECT_EQ(s.find("S(0),R -> S(0)"), std::string::npos) << s;
  // an empty dim is never sharded
  auto empty = make_case("aten.relu.default", {{{0, 8}}}, "[$0]", {{{0, 8}}});
  EXPECT_FALSE(strategies(*empty, {4}).count("S(0) -> S(0)"));
}

}  // namespace
}  // namespace autoshard::testing_rules
