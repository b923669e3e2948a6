// Graph JSON reader: fixtures parse into the IR, and bad input is rejected with a message that
// names the node and the field.
#include <gtest/gtest.h>

#include "autoshard/graph.h"

#include "test_data_paths.h"
#include "test_planner_util.h"
#include "io/json.h"
#include "io/graph_json.h"

using namespace autoshard;

namespace {
std::string parse_error(const std::string& text) {
  return error_of([&] { parse_graph(parse_json(text)); });
}

const char* kHead = R"({"version": 1, "nodes": [
  {"name": "w", "op": "placeholder", "role": "parameter", "fqn": "lin.weight",
   "outputs": [{"shape": [8, 4], "dtype": "float32"}]},
  {"name": "x", "op": "placeholder", "role": "input", "input_index": 0,
   "outputs": [{"shape": [2, 4], "dtype": "bfloat16"}]})";
}  // namespace

TEST(GraphParse, ReadsTheMlpFixture) {
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  ASSERT_EQ(g.nodes.size(), 20u);
  const Node& w1 = g.nodes[g.index_by_name.at("primals_1")];
  EXPECT_EQ(w1.role, NodeRole::Parameter);
  EXPECT_EQ(w1.fqn, "w1.weight");
  EXPECT_EQ(w1.outputs[0]->shape, (std::vector<int64_t>{1024, 1024}));
  EXPECT_EQ(w1.outputs[0]->bytes(), 1024 * 1024 * 4);
  const Node& tan = g.nodes[g.index_by_name.at("tangents_1")];
  EXPECT_EQ(tan.role, NodeRole::Tangent);
  EXPECT_EQ(tan.tangent_of, 0);
  EXPECT_EQ(tan.outputs[0]->numel(), 1);  // a scalar
  const Node& mm = g.nodes[g.index_by_name.at("mm")];
  EXPECT_EQ(mm.phase, Phase::Forward);
  EXPECT_EQ(mm.module, "w1");
  EXPECT_NE(mm.source.find("mlp.py:10"), std::string::npos);
  auto refs = mm.tensor_inputs();
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(g.nodes[refs[0].node].name, "primals_3");
  EXPECT_EQ(g.nodes[refs[1].node].name, "t");
  // expand's shape argument is a list of ints, not a tensor.
  const Node& ex = g.nodes[g.index_by_name.at("expand")];
  EXPECT_EQ(ex.tensor_inputs().size(), 1u);
  EXPECT_EQ(ex.args[1].as_int_list("size"), (std::vector<int64_t>{65536, 1024}));
  ASSERT_EQ(g.outputs.size(), 3u);
  EXPECT_EQ(g.outputs[0].role, GraphOutput::Role::Output);
  EXPECT_EQ(g.outputs[1].role, GraphOutput::Role::Grad);
  EXPECT_EQ(g.nodes[g.outputs[1].grad_of].name, "primals_1");
  EXPECT_EQ(g.nodes[g.outputs[1].ref.node].name, "mm_4");
}

TEST(GraphParse, TensorInputsWalkArgsThenKwargsDepthFirst) {
  std::string text = std::string(kHead) + R"(,
  {"name": "c", "op": "aten.cat.default", "args": [[{"ref": "x"}, null, {"ref": "w", "index": 0}], 0],
   "kwargs": {"out": {"ref": "x"}}, "outputs": [{"shape": [10, 4], "dtype": "float32"}, null]}],
  "outputs": []})";
  Graph g = parse_graph(parse_json(text));
  const Node& c = g.nodes[2];
  auto refs = c.tensor_inputs();
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ(refs[0].node, 1);
  EXPECT_EQ(refs[1].node, 0);
  EXPECT_EQ(refs[2].node, 1);
  EXPECT_FALSE(c.outputs[1].has_value());
  EXPECT_EQ(g.nodes[1].outputs[0]->dtype, DType::BFloat16);
  ASSERT_NE(c.kwarg("out"), nullptr);
  EXPECT_TRUE(c.kwarg("out")->is_tensor());
}

TEST(GraphParse, ErrorsNameTheNodeAndField) {
  std::string unknown_ref = std::string(kHead) + R"(,
  {"name": "mm", "op": "aten.mm.default", "args": [{"ref": "nope"}], "outputs": []}], "outputs": []})";
  std::string e = parse_error(unknown_ref);
  EXPECT_NE(e.find("'mm'"), std::string::npos) << e;
  EXPECT_NE(e.find("args[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown node 'nope'"), std::string::npos) << e;

  std::string bad_dtype = R"({"version": 1, "nodes": [{"name": "x", "op": "placeholder", "role": "input",
    "input_index": 0, "outputs": [{"shape": [2], "dtype": "float33"}]}], "outputs": []})";
  e = parse_error(bad_dtype);
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  EXPECT_NE(e.find("dtype"), std::string::npos) << e;

  std::string bad_role = R"({"version": 1, "nodes": [{"name": "x", "op": "placeholder", "role": "weight",
    "outputs": [{"shape": [2], "dtype": "float32"}]}], "outputs": []})";
  e = parse_error(bad_role);
  EXPECT_NE(e.find("unknown role 'weight'"), std::string::npos) << e;

  std::string dup = std::string(kHead) + R"(,
  {"name": "x", "op": "aten.relu.default", "args": [{"ref": "x"}], "outputs": []}], "outputs": []})";
  EXPECT_NE(parse_error(dup).find("duplicate node name"), std::string::npos);

  std::string bad_index = std::string(kHead) + R"(,
  {"name": "r", "op": "aten.relu.default", "args": [{"ref": "x", "index": 3}], "outputs": []}], "outputs": []})";
  EXPECT_NE(parse_error(bad_index).find("out of range"), std::string::npos);

  std::string bad_grad = std::string(kHead) + R"(], "outputs": [{"ref": "x", "role": "grad", "grad_of": "zz"}]})";
  EXPECT_NE(parse_error(bad_grad).find("grad_of"), std::string::npos);

  EXPECT_NE(parse_error(R"({"version": 2, "nodes": [], "outputs": []})").find("version"), std::string::npos);
  EXPECT_NE(parse_error(R"({"version": 1, "nodes": []})").find("outputs"), std::string::npos);
}

TEST(GraphParse, LocalInputsAreReadAndChecked) {
  std::string ok = std::string(kHead) + R"(,
  {"name": "c", "op": "aten._to_copy.default", "args": [{"ref": "w"}], "kwargs": {"dtype": {"dtype": "bfloat16"}},
   "outputs": [{"shape": [8, 4], "dtype": "bfloat16"}], "local_inputs": [0]}], "outputs": []})";
  Graph g = parse_graph(parse_json(ok));
  EXPECT_EQ(g.nodes[2].local_inputs, std::vector<int32_t>{0});
  EXPECT_TRUE(g.nodes[1].local_inputs.empty());

  std::string bad = std::string(kHead) + R"(,
  {"name": "c", "op": "aten._to_copy.default", "args": [{"ref": "w"}],
   "outputs": [{"shape": [8, 4], "dtype": "bfloat16"}], "local_inputs": [1]}], "outputs": []})";
  const std::string e = parse_error(bad);
  EXPECT_NE(e.find("'c'"), std::string::npos) << e;
  EXPECT_NE(e.find("local_inputs"), std::string::npos) << e;
  EXPECT_NE(e.find("1 tensor input"), std::string::npos) << e;
}
