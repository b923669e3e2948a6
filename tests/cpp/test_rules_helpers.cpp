// Shared rule helpers: chunk-semantics local sizes, broadcast maps, cast/Partial algebra.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

using namespace autoshard::rule;

TEST(RulesHelpers, MinLocalSizeFollowsChunkSemanticsMeshDimByMeshDim) {
  Mesh m{{3}, {"x"}};
  EXPECT_EQ(min_local_size(4, m, L({"S(0)"}), 0), 0);  // 2,2,0
  EXPECT_EQ(min_local_size(5, m, L({"S(0)"}), 0), 1);  // 2,2,1
  EXPECT_EQ(min_local_size(5, m, L({"R"}), 0), 5);
  Mesh m22{{2, 2}, {"a", "b"}};
  // 5 over (2, then 2): 3|2 -> (2,1)|(1,1): min 1, while a flat 4-way chunk would give 2,2,1,0
  EXPECT_EQ(min_local_size(5, m22, L({"S(0)", "S(0)"}), 0), 1);
  EXPECT_EQ(min_local_size(3, m22, L({"S(0)", "S(0)"}), 0), 0);  // 2|1 -> (1,1)|(1,0)
  EXPECT_TRUE(has_empty_shard(m, L({"S(1)"}), TensorMeta{{2, 4}}));
  EXPECT_FALSE(has_empty_shard(m, L({"S(0)"}), TensorMeta{{3, 4}}));
}

TEST(RulesHelpers, BroadcastSourceDim) {
  EXPECT_EQ(broadcast_source_dim({2, 16, 64}, 2, {64}), 0);
  EXPECT_EQ(broadcast_source_dim({2, 16, 64}, 1, {64}), -1);
  EXPECT_EQ(broadcast_source_dim({2, 16, 64}, 2, {2, 16, 1}), -1);
  EXPECT_EQ(broadcast_source_dim({2, 16, 64}, 0, {2, 16, 1}), 0);
}

TEST(RulesHelpers, PartialSurvivesCast) {
  EXPECT_TRUE(partial_survives_cast(ReduceOp::Sum, DType::Float32, DType::BFloat16));
  EXPECT_FALSE(partial_survives_cast(ReduceOp::Sum, DType::Float32, DType::Int64));
  EXPECT_TRUE(partial_survives_cast(ReduceOp::Max, DType::Float32, DType::Int64));
  EXPECT_FALSE(partial_survives_cast(ReduceOp::Max, DType::Float32, DType::Bool));
  EXPECT_TRUE(partial_survives_cast(ReduceOp::Sum, DType::Int64, DType::Float32));
  EXPECT_FALSE(partial_survives_cast(ReduceOp::Sum, DType::Bool, DType::Int64));
  // every float8 / complex kind is one (trunc of a float8 sum is not the sum of truncs)
  EXPECT_FALSE(partial_survives_cast(ReduceOp::Sum, DType::Float8E5M2, DType::Int64));
  EXPECT_TRUE(partial_survives_cast(ReduceOp::Max, DType::Float8E5M2, DType::Int64));
  EXPECT_FALSE(partial_survives_cast(ReduceOp::Max, DType::Float32, DType::Complex128));
  EXPECT_TRUE(partial_survives_cast(ReduceOp::Sum, DType::Complex128, DType::Complex64));
}

TEST(RulesAttention, EmptyHeadBlocksAreRejected) {
  // 4 heads over 3 ranks chunk as 2,2,0: the CPU flash kernel crashes on the empty block.
  auto c = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 4, 16, 16}}, {{2, 4, 16}}}, "{}", {3});
  Layout s = L({"S(1)"});
  EXPECT_FALSE(c->accept({s, s}, {s, s, s}));
  auto d = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 5, 16, 16}}, {{2, 5, 16, 16}}, {{2, 5, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 5, 16, 16}}, {{2, 5, 16}}}, "{}", {3});
  EXPECT_TRUE(d->accept({s, s}, {s, s, s}));  // 2,2,1: uneven but non-empty
}

TEST(RulesHelpers, BadArgumentsGiveAClearError) {
  auto c = make_case("aten.transpose.int", {{{2, 3}}}, "[$0, 0, 5]", {{{3, 2}}});
  try {
    c->rows();
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aten.transpose.int"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace autoshard::testing_rules
