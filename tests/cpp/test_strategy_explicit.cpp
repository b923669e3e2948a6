// Explicit strategies carried by a node (a user's sharding rule, evaluated by the tracer into
// the graph JSON's "strategies"): read and checked with the node named, expanded to the mesh
// like a rule's rows, winning over a C++ rule, and costed as memory-bound.
#include <gtest/gtest.h>

#include <set>

#include "autoshard/layout.h"
#include "autoshard/rules.h"
#include "autoshard/strategy.h"
#include "test_planner_util.h"
#include "io/json.h"
#include "io/graph_json.h"

using namespace autoshard;

namespace {

// rowscale(x[B, D], w[D]) -> y[B, D] with the user's rows spliced in as "strategies" (JSON text).
std::string rowscale_graph(const std::string& op, const std::string& strategies, int64_t batch = 8) {
  return R"({"version": 1, "nodes": [
    {"name": "x", "op": "placeholder", "role": "input", "input_index": 0,
     "outputs": [{"shape": [)" +
         std::to_string(batch) + R"(, 6], "dtype": "float32"}]},
    {"name": "w", "op": "placeholder", "role": "parameter", "fqn": "w",
     "outputs": [{"shape": [6], "dtype": "float32"}]},
    {"name": "y", "op": ")" +
         op + R"(", "args": [{"ref": "x"}, {"ref": "w"}, 1e-6],
     "source": "model.py:9 in forward", "strategies": )" +
         strategies + R"(,
     "outputs": [{"shape": [)" +
         std::to_string(batch) + R"(, 6], "dtype": "float32"}]}],
    "outputs": [{"ref": "y", "role": "output", "output_index": 0}]})";
}

const char* kBatchRows = R"J([{"outputs": ["R"], "inputs": ["R", "R"]},
                             {"outputs": ["S(0)"], "inputs": ["S(0)", "R"]}])J";

std::string parse_error(const std::string& text) {
  return error_of([&] { parse_graph(parse_json(text)); });
}

std::set<std::string> strategy_strs(const std::vector<Strategy>& s) {
  std::set<std::string> out;
  for (const auto& st : s) out.insert(strategy_str(st));
  return out;
}

struct StrategyExplicit : ::testing::Test {
  MeshModel m8 = MeshModel::make(Mesh{{8}, {}}, "H100");
  MeshModel m22 = MeshModel::make(Mesh{{2, 2}, {}}, "H100");
};

}  // namespace

TEST_F(StrategyExplicit, ReadFromJson) {
  Graph g = parse_graph(parse_json(rowscale_graph("mylib.rowscale.default", kBatchRows)));
  const Node& y = g.nodes[2];
  ASSERT_TRUE(y.strategies.has_value());
  ASSERT_EQ(y.strategies->size(), 2u);
  EXPECT_EQ((*y.strategies)[1].outputs, (std::vector<Placement>{Placement::shard(0)}));
  EXPECT_EQ((*y.strategies)[1].inputs, (std::vector<Placement>{Placement::shard(0), Placement::replicate()}));
  EXPECT_FALSE(g.nodes[0].strategies.has_value());
}

TEST_F(StrategyExplicit, UsedForAnOpWithoutRuleOnOneAndTwoDimMeshes) {
  Graph g = parse_graph(parse_json(rowscale_graph("mylib.rowscale.default", kBatchRows)));
  EXPECT_EQ(strategy_strs(enumerate_node_strategies(g, 2, m8)), (std::set<std::string>{"R,R -> R", "S(0),R -> S(0)"}));
  // On a 2-D mesh: the Cartesian product of the rows over both mesh dims, as DTensor expands
  // register_sharding's single-dim strategies.
  EXPECT_EQ(
      strategy_strs(enumerate_node_strategies(g, 2, m22)),
      (std::set<std::string>{"RR,RR -> RR", "S(0)R,RR -> S(0)R", "RS(0),RR -> RS(0)", "S(0)S(0),RR -> S(0)S(0)"}));
  // The whole graph enumerates (no missing-rule error for the custom op).
  EXPECT_EQ(enumerate_strategies(g, m22).size(), 3u);
}

TEST_F(StrategyExplicit, NoAllReplicateRowIsAdded) {
  // DTensor runs exactly the user's list; the planner must not offer more.
  Graph g = parse_graph(
      parse_json(rowscale_graph("mylib.rowscale.default", R"J([{"outputs": ["S(0)"], "inputs": ["S(0)", "R"]}])J")));
  EXPECT_EQ(strategy_strs(enumerate_node_strategies(g, 2, m22)), (std::set<std::string>{"S(0)S(0),RR -> S(0)S(0)"}));
}

TEST_F(StrategyExplicit, WinOverTheCppRule) {
  // aten.mul.Tensor has a pointwise rule with shards on both dims; the node's rows replace it.
  Graph g = parse_graph(parse_json(rowscale_graph("aten.mul.Tensor", kBatchRows)));
  EXPECT_EQ(strategy_strs(enumerate_node_strategies(g, 2, m8)), (std::set<std::string>{"R,R -> R", "S(0),R -> S(0)"}));
}

TEST_F(StrategyExplicit, CostedAsMemoryBoundOnLocalShapes) {
  Graph g = parse_graph(parse_json(rowscale_graph("mylib.rowscale.default", kBatchRows)));
  for (const auto& st : enumerate_node_strategies(g, 2, m8)) {
    // S(0) on 8 ranks: x and y [1, 6] per rank, w [6]
    const double bytes = strategy_str(st) == "R,R -> R" ? (48 + 6 + 48) * 4.0 : (6 + 6 + 6) * 4.0;
    EXPECT_DOUBLE_EQ(st.compute_us, compute_time_us(m8.hw, 0.0, bytes, DType::Float32)) << strategy_str(st);
  }
}

TEST_F(StrategyExplicit, UnshardableRowsDroppedAndNoneLeftIsAnError) {
  // 4 rows over 8 ranks: S(0) is not shardable (DTensor's rule), only R is left.
  Graph g = parse_graph(parse_json(rowscale_graph("mylib.rowscale.default", kBatchRows, 4)));
  EXPECT_EQ(strategy_strs(enumerate_node_strategies(g, 2, m8)), (std::set<std::string>{"R,R -> R"}));
  Graph only_shard = parse_graph(
      parse_json(rowscale_graph("mylib.rowscale.default", R"J([{"outputs": ["S(0)"], "inputs": ["S(0)", "R"]}])J", 4)));
  try {
    enumerate_strategies(only_shard, m8);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("mylib.rowscale.default"), std::string::npos) << m;
    EXPECT_NE(m.find("'y'"), std::string::npos) << m;
    EXPECT_NE(m.find("8 mesh"), std::string::npos) << m;
  }
}

TEST_F(StrategyExplicit, BadStrategiesNameTheNodeOpAndWhatIsWrong) {
  const std::string op = "mylib.rowscale.default";
  std::string m = parse_error(rowscale_graph(op, R"J([{"outputs": ["S(0)"], "inputs": ["S(0)"]}])J"));
  EXPECT_NE(m.find("'y' (mylib.rowscale.default)"), std::string::npos) << m;
  EXPECT_NE(m.find("strategies[0].inputs': 1 placement(s), but the node has 2 tensor input(s)"), std::string::npos)
      << m;
  m = parse_error(rowscale_graph(op, R"J([{"outputs": [], "inputs": ["R", "R"]}])J"));
  EXPECT_NE(m.find("strategies[0].outputs': 0 placement(s), but the node has 1 output(s)"), std::string::npos) << m;
  m = parse_error(rowscale_graph(op, R"J([{"outputs": ["R"], "inputs": ["R", "S(1)"]}])J"));
  EXPECT_NE(m.find("strategies[0].inputs[1]': S(1) shards dim 1 of a tensor with 1 dim(s) (shape [6])"),
            std::string::npos)
      << m;
  m = parse_error(rowscale_graph(op, R"J([{"outputs": ["S(-1)"], "inputs": ["R", "R"]}])J"));
  EXPECT_NE(m.find("strategies[0].outputs[0]': invalid placement 'S(-1)'"), std::string::npos) << m;
  m = parse_error(rowscale_graph(op, R"J([])J"));
  EXPECT_NE(m.find("field 'strategies': empty"), std::string::npos) << m;
  m = parse_error(rowscale_graph(op, R"J([{"outputs": [null], "inputs": ["R", "R"]}])J"));
  EXPECT_NE(m.find("null, but output 0 is a tensor"), std::string::npos) << m;
}
