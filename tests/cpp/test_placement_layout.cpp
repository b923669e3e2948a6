// Placements and local shapes against torch.chunk ground truth (values worked out by hand from
// torch.chunk: ceil-sized chunks, trailing chunks short or empty).
#include <gtest/gtest.h>

#include "autoshard/layout.h"

#include "test_layout_util.h"
#include "io/json.h"
#include "io/layout_json.h"

using namespace autoshard;

namespace {
Mesh mesh(std::vector<int64_t> shape) { return Mesh{std::move(shape), {}}; }
}  // namespace

TEST(Placement, ParseAndPrintRoundTrip) {
  for (const char* s : {"R", "S(0)", "S(3)", "P(sum)", "P(avg)", "P(max)", "P(min)"})
    EXPECT_EQ(Placement::parse(s).str(), s);
  EXPECT_TRUE(Placement::parse("S(2)").is_shard(2));
  EXPECT_EQ(Placement::parse("P(max)").reduce, ReduceOp::Max);
  for (const char* bad : {"", "S", "S()", "S(-1)", "S(x)", "P(prod)", "Shard(0)", "r"})
    EXPECT_THROW(Placement::parse(bad), std::invalid_argument) << bad;
  EXPECT_EQ(layout_str(L({"S(0)", "R"})), "S(0)R");
  EXPECT_EQ(layout_list_str(L({"S(0)", "P(sum)"})), "[\"S(0)\",\"P(sum)\"]");
  EXPECT_NE(Placement::partial(ReduceOp::Sum), Placement::partial(ReduceOp::Max));
}

TEST(Layout, ChunkSizesFollowTorchChunk) {
  // torch.chunk(torch.arange(5), 4) -> sizes 2, 2, 1 and an empty 4th chunk.
  EXPECT_EQ(chunk_size(5, 4, 0), 2);
  EXPECT_EQ(chunk_size(5, 4, 1), 2);
  EXPECT_EQ(chunk_size(5, 4, 2), 1);
  EXPECT_EQ(chunk_size(5, 4, 3), 0);
  // 3 over 4 -> 1, 1, 1, 0; 8 over 4 -> 2 each.
  EXPECT_EQ(chunk_size(3, 4, 3), 0);
  EXPECT_EQ(chunk_size(8, 4, 3), 2);
  // 10 over 4: chunk 3 -> 3, 3, 3, 1.
  EXPECT_EQ(chunk_size(10, 4, 3), 1);
}

TEST(Layout, LocalShapesPerRank) {
  auto m = mesh({4});
  auto shapes = local_shapes_per_rank({5, 3}, L({"S(0)"}), m);
  ASSERT_EQ(shapes.size(), 4u);
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shapes[2], (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(shapes[3], (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(max_local_shape({5, 3}, L({"S(0)"}), m), (std::vector<int64_t>{2, 3}));

  // Two mesh dims sharding one tensor dim split it left to right: N=5 on (2,2): mesh dim 0
  // gives 3|2, then 3 -> 2|1 and 2 -> 1|1 (not the flat 4-way 2,2,1,0).
  auto m22 = mesh({2, 2});
  auto s = local_shapes_per_rank({5}, L({"S(0)", "S(0)"}), m22);
  EXPECT_EQ(s[0][0], 2);
  EXPECT_EQ(s[1][0], 1);
  EXPECT_EQ(s[2][0], 1);
  EXPECT_EQ(s[3][0], 1);
  // Different tensor dims on the two mesh dims; rank 1 = coordinate (0, 1).
  auto t = local_shapes_per_rank({6, 7}, L({"S(1)", "S(0)"}), m22);
  EXPECT_EQ(t[1], (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(t[2], (std::vector<int64_t>{3, 3}));
  // Partial and Replicate keep the full shape.
  EXPECT_EQ(max_local_shape({6, 7}, L({"P(sum)", "R"}), m22), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(num_shards(L({"S(0)", "P(sum)"}), m22), 2);
}

TEST(Layout, Shardability) {
  auto m22 = mesh({2, 2});
  EXPECT_TRUE(is_shardable({4, 3}, L({"S(0)", "S(0)"}), m22));
  EXPECT_TRUE(is_shardable({3, 3}, L({"S(0)", "S(0)"}), m22));   // 3 -> ceil 2 -> 2 >= 2
  EXPECT_FALSE(is_shardable({2, 3}, L({"S(0)", "S(0)"}), m22));  // 2 -> 1 < 2
  EXPECT_FALSE(is_shardable({1, 3}, L({"S(0)", "R"}), m22));
  EXPECT_FALSE(is_shardable({4}, L({"S(1)", "R"}), m22));  // no dim 1
  EXPECT_TRUE(has_mixed_partial(L({"P(sum)", "P(max)"})));
  EXPECT_FALSE(has_mixed_partial(L({"P(sum)", "P(sum)"})));
  // Placeholder layouts: (rank + 1)^mesh_dims minus the unshardable ones.
  EXPECT_EQ(all_unpartial_layouts({8, 8}, m22).size(), 9u);
  EXPECT_EQ(all_unpartial_layouts({8, 1}, m22).size(), 4u);  // R/S(0) per mesh dim
  EXPECT_EQ(all_unpartial_layouts({}, m22).size(), 1u);      // scalar: R only
  EXPECT_EQ(all_unpartial_layouts({64, 64, 64}, mesh({8, 8})).size(), 16u);
  // 8 rows cannot be split 8 x 8: S(d)S(d) is dropped for each of the 3 dims.
  EXPECT_EQ(all_unpartial_layouts({8, 8, 8}, mesh({8, 8})).size(), 13u);
}

TEST(Layout, JsonForm) {
  auto m22 = mesh({2, 2});
  Layout l = parse_layout(parse_json(R"j(["S(1)", "P(avg)"])j"), m22, "x");
  EXPECT_EQ(l, L({"S(1)", "P(avg)"}));
  EXPECT_EQ(layout_to_json(l).dump(), R"j(["S(1)","P(avg)"])j");
  EXPECT_THROW(parse_layout(parse_json(R"j(["R"])j"), m22, "x"), JsonError);
  EXPECT_THROW(parse_layout(parse_json(R"j(["R", "Q"])j"), m22, "x"), JsonError);
  EXPECT_NE(layout_code(L({"S(0)", "R"})), layout_code(L({"R", "S(0)"})));
}
