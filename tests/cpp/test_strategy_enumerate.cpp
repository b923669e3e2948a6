// Strategy enumeration with test-only rules (registered under "test.*" names so they never
// collide with the real rule files): Cartesian expansion, filters, dedupe, local-shape costs.
#include <gtest/gtest.h>

#include "autoshard/layout.h"
#include "autoshard/rules.h"
#include "autoshard/strategy.h"
#include "io/json.h"
#include "io/graph_json.h"

using namespace autoshard;

namespace {

Placement R() { return Placement::replicate(); }
Placement S(int d) { return Placement::shard(d); }
Placement P() { return Placement::partial(); }

double mm_flops(const std::vector<TensorMeta>& in) { return 2.0 * in[0].shape[0] * in[0].shape[1] * in[1].shape[1]; }

void register_test_rules() {
  static bool done = false;
  if (done) return;
  done = true;
  OpRule mm;
  mm.rows = [](const RuleContext&) {
    return std::vector<ShardingRow>{{{S(0)}, {S(0), R()}}, {{S(1)}, {R(), S(1)}}, {{P()}, {S(1), S(0)}}};
  };
  mm.flops = [](const RuleContext&, const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&) {
    return mm_flops(in);
  };
  RuleRegistry::instance().add("test.matmul", mm);
  OpRule no_partial = mm;
  no_partial.accept = [](const RuleContext&, const std::vector<Layout>& outs, const std::vector<Layout>&) {
    return !has_partial(outs[0]);
  };
  RuleRegistry::instance().add("test.matmul_no_partial", no_partial);
  OpRule view = mm;
  view.is_view = true;
  RuleRegistry::instance().add("test.matmul_view", view);
  // A rule that repeats the all-Replicate row and a duplicate row: dedupe must drop them.
  OpRule dup = mm;
  dup.rows = [](const RuleContext&) {
    return std::vector<ShardingRow>{{{R()}, {R(), R()}}, {{S(0)}, {S(0), R()}}, {{S(0)}, {S(0), R()}}};
  };
  RuleRegistry::instance().add("test.matmul_dup", dup);
}

Graph matmul_graph(const std::string& op, int64_t m, int64_t k, int64_t n) {
  std::string text = R"({"version": 1, "nodes": [
    {"name": "x", "op": "placeholder", "role": "input", "input_index": 0,
     "outputs": [{"shape": [)" +
                     std::to_string(m) + "," + std::to_string(k) + R"(], "dtype": "float32"}]},
    {"name": "w", "op": "placeholder", "role": "parameter", "fqn": "w",
     "outputs": [{"shape": [)" +
                     std::to_string(k) + "," + std::to_string(n) + R"(], "dtype": "float32"}]},
    {"name": "y", "op": ")" +
                     op + R"(", "args": [{"ref": "x"}, {"ref": "w"}], "source": "model.py:7 in f",
     "outputs": [{"shape": [)" +
                     std::to_string(m) + "," + std::to_string(n) + R"(], "dtype": "float32"}]}],
    "outputs": [{"ref": "y", "role": "output", "output_index": 0}]})";
  return parse_graph(parse_json(text));
}

struct StrategyEnumerate : ::testing::Test {
  void SetUp() override { register_test_rules(); }
  MeshModel m22 = MeshModel::make(Mesh{{2, 2}, {}}, "H100");
};

}  // namespace

TEST_F(StrategyEnumerate, CartesianProductOverMeshDims) {
  Graph g = matmul_graph("test.matmul", 8, 4, 6);
  auto s = enumerate_node_strategies(g, 2, m22);
  // (3 rows + all-R)^2 mesh dims, all shardable.
  ASSERT_EQ(s.size(), 16u);
  EXPECT_EQ(strategy_str(s[0]), "RR,RR -> RR");  // all-Replicate first
  bool found = false;
  for (const auto& st : s)
    if (strategy_str(st) == "S(1)S(0),S(0)R -> P(sum)S(0)") found = true;
  EXPECT_TRUE(found);
  // Costs are on local shapes: S(0)S(0) on x gives [2,4] x [4,6] per GPU.
  const HardwareProfile& hw = m22.hw;
  EXPECT_DOUBLE_EQ(s[0].compute_us, compute_time_us(hw, 2.0 * 8 * 4 * 6, (32 + 24 + 48) * 4.0, DType::Float32));
  for (const auto& st : s)
    if (strategy_str(st) == "S(0)S(0),RR -> S(0)S(0)")
      EXPECT_DOUBLE_EQ(st.compute_us, compute_time_us(hw, 2.0 * 2 * 4 * 6, (8 + 24 + 12) * 4.0, DType::Float32));
}

TEST_F(StrategyEnumerate, FiltersUnshardableLayouts) {
  // x has 2 rows: S(0) on both mesh dims would leave 1 row for 2 ranks.
  Graph g = matmul_graph("test.matmul", 2, 4, 6);
  auto s = enumerate_node_strategies(g, 2, m22);
  EXPECT_EQ(s.size(), 15u);
  for (const auto& st : s) EXPECT_NE(layout_str(st.inputs[0]), "S(0)S(0)");
  // A 1-row x cannot take S(0) anywhere: rows with S(0) on x are gone on both mesh dims.
  Graph g1 = matmul_graph("test.matmul", 1, 4, 6);
  EXPECT_EQ(enumerate_node_strategies(g1, 2, m22).size(), 9u);
}

TEST_F(StrategyEnumerate, AcceptDedupeAndViews) {
  Graph g = matmul_graph("test.matmul_no_partial", 8, 4, 6);
  auto s = enumerate_node_strategies(g, 2, m22);
  EXPECT_EQ(s.size(), 9u);  // (R, S(0), S(1)) per mesh dim
  Graph d = matmul_graph("test.matmul_dup", 8, 4, 6);
  EXPECT_EQ(enumerate_node_strategies(d, 2, m22).size(), 4u);  // {R, S(0)}^2
  Graph v = matmul_graph("test.matmul_view", 8, 4, 6);
  // a view costs nothing and says that it aliases its input (the lowering reads that for
  // memory instead of asking the rule registry)
  for (const auto& st : enumerate_node_strategies(v, 2, m22)) {
    EXPECT_EQ(st.compute_us, 0);
    EXPECT_TRUE(st.aliases_input);
  }
  for (const auto& st : s) EXPECT_FALSE(st.aliases_input);
}

TEST_F(StrategyEnumerate, PlaceholdersGetEveryUnpartialLayout) {
  Graph g = matmul_graph("test.matmul", 8, 4, 6);
  auto x = enumerate_node_strategies(g, 0, m22);
  EXPECT_EQ(x.size(), 9u);
  for (const auto& st : x) {
    EXPECT_TRUE(st.inputs.empty());
    EXPECT_FALSE(has_partial(*st.outputs[0]));
    EXPECT_EQ(st.compute_us, 0);
  }
}

TEST_F(StrategyEnumerate, MissingRuleNamesOpNodeAndSource) {
  Graph g = matmul_graph("test.no_such_op", 8, 4, 6);
  try {
    enumerate_strategies(g, m22);
    FAIL() << "expected UnsupportedOpError";
  } catch (const UnsupportedOpError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("test.no_such_op"), std::string::npos) << m;
    EXPECT_NE(m.find("'y'"), std::string::npos) << m;
    EXPECT_NE(m.find("model.py:7"), std::string::npos) << m;
    EXPECT_NE(m.find("register_sharding"), std::string::npos) << m;  // the fix from Python
    EXPECT_NE(m.find("open an issue"), std::string::npos) << m;
    EXPECT_EQ(m.find("cpp/src"), std::string::npos) << m;  // users cannot edit autoshard's sources
  }
}

TEST_F(StrategyEnumerate, RealRulesCoverTheMlpFixture) {
  Graph g = read_graph_file(std::string(AUTOSHARD_SOURCE_DIR) + "/tests/cpp/data/mlp2_fwd_bwd.json");
  auto all = enumerate_strategies(g, m22);
  ASSERT_EQ(all.size(), g.nodes.size());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_FALSE(all[i].empty()) << g.nodes[i].name;
    for (const auto& st : all[i]) {
      ASSERT_EQ(st.outputs.size(), g.nodes[i].outputs.size());
      for (size_t k = 0; k < st.outputs.size(); ++k)
        if (st.outputs[k]) EXPECT_TRUE(is_shardable(g.nodes[i].outputs[k]->shape, *st.outputs[k], m22.mesh));
    }
  }
}
