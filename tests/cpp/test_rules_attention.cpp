// SDPA rules: batch / head rows, GQA acceptance, FLOPs, broadcast biases / masks.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesAttention, FlashCpuForwardBatchAndHeads) {
  auto c = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 4, 16, 16}}, {{2, 4, 16}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0),S(0)|S(0),S(0),S(0)", "S(1),S(1)|S(1),S(1),S(1)",
                                                       "S(2),S(2)|S(2),R,R"}));
  EXPECT_DOUBLE_EQ(c->flops({{{2, 2, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}}, {}), 0.5 * 4.0 * 2 * 2 * 16 * 16 * 16);
}

TEST(RulesAttention, GqaHeadShardingNeedsBothHeadCountsToDivide) {
  // q has 4 heads, k/v 2 heads.
  auto c = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 4, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 4, 16, 16}}, {{2, 4, 16}}}, "{}", {2, 2});
  Layout h2 = L({"S(1)", "R"}), h4 = L({"S(1)", "S(1)"}), b = L({"S(0)", "R"});
  EXPECT_TRUE(c->accept({h2, h2}, {h2, h2, h2}));   // 4/2 q heads use 2/2 kv heads
  EXPECT_FALSE(c->accept({h4, h4}, {h4, h4, h4}));  // 2 kv heads cannot feed 4 ranks' q heads
  EXPECT_TRUE(c->accept({b, b}, {b, b, b}));
  // Equal head counts: uneven head chunks line up by themselves.
  auto e = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 3, 16, 16}}, {{2, 3, 16, 16}}, {{2, 3, 16, 16}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 3, 16, 16}}, {{2, 3, 16}}}, "{}", {2});
  Layout s = L({"S(1)"});
  EXPECT_TRUE(e->accept({s, s}, {s, s, s}));
}

TEST(RulesAttention, FlashCpuBackward) {
  auto c = make_case(
      "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
      {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16}}},
      "[$0, $1, $2, $3, $4, $5, 0.0, true]", {{{2, 4, 16, 16}}, {{2, 2, 16, 16}}, {{2, 2, 16, 16}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0),S(0),S(0)|S(0),S(0),S(0),S(0),S(0),S(0)",
                                                       "S(1),S(1),S(1)|S(1),S(1),S(1),S(1),S(1),S(1)",
                                                       "S(2),P(sum),P(sum)|S(2),S(2),R,R,S(2),S(2)"}));
  // causal: the kernel skips the masked blocks, about half the dense work
  EXPECT_DOUBLE_EQ(c->flops({{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 2, 16, 16}}}, {}),
                   0.5 * 2.5 * 4.0 * 2 * 4 * 16 * 16 * 16);
}

TEST(RulesAttention, VarlenSplitsHeadsAndPricesTheMeanDocument) {
  // 40 packed tokens in 2 documents, 4 query heads over 2 KV heads (GQA)
  const std::vector<TensorSpec> in = {{{40, 4, 8}}, {{40, 2, 8}}, {{40, 2, 8}}, {{3}, "int32"}, {{3}, "int32"}};
  const std::vector<TensorSpec> out = {{{40, 4, 8}}, {{4, 40}}, {{2}, "uint64"}};
  auto c = make_case("torch_attn._varlen_attn.default", in, "[$0, $1, $2, $3, $4, 25, 25, true, null, [-1, 0]]",
                     out, "{}", {2});
  EXPECT_EQ(row_set(c->rows()),
            (std::set<std::string>{"S(1),S(0),R|S(1),S(1),S(1),R,R", "S(0),S(1),R|S(0),S(0),S(0),R,R"}));
  Layout h = L({"S(1)"}), r = L({"R"});
  EXPECT_TRUE(c->accept({h, L({"S(0)"}), r}, {h, h, h, r, r}));
  auto four = make_case("torch_attn._varlen_attn.default", in, "[$0, $1, $2, $3, $4, 25, 25, true, null, [-1, 0]]",
                        out, "{}", {4});
  EXPECT_FALSE(four->accept({h, L({"S(0)"}), r}, {h, h, h, r, r}));  // 2 KV heads over 4 ranks
  // causal, 2 documents of 20 tokens on average: half of 4 * 40 * 20 * 4 * 8
  EXPECT_DOUBLE_EQ(c->flops({{{40, 4, 8}}, {{40, 2, 8}}, {{40, 2, 8}}, {{3}}, {{3}}}, {}), 0.5 * 4.0 * 40 * 20 * 4 * 8);
  // a block of 20 tokens: its queries against documents of the global mean length
  EXPECT_DOUBLE_EQ(c->flops({{{20, 4, 8}}, {{20, 2, 8}}, {{20, 2, 8}}, {{3}}, {{3}}}, {}), 0.5 * 4.0 * 20 * 20 * 4 * 8);
  Layout t = L({"S(0)"});
  EXPECT_FALSE(c->accept({t, L({"S(1)"}), r}, {t, t, t, r, r}));  // blocks of 20, max_q 25
  auto odd = make_case("torch_attn._varlen_attn.default", {{{41, 4, 8}}, {{41, 2, 8}}, {{41, 2, 8}}, in[3], in[4]},
                       "[$0, $1, $2, $3, $4, 25, 25, true, null, [-1, 0]]", {{{41, 4, 8}}, {{4, 41}}, out[2]}, "{}", {2});
  EXPECT_FALSE(odd->accept({t, L({"S(1)"}), r}, {t, t, t, r, r}));  // 41 tokens over 2 ranks
  // rows of 10 tokens (max_q 10): blocks of 20 hold whole rows, blocks of 10 on 4 ranks too;
  // rows of 20 split over 4 ranks would not
  auto rows = [&](int64_t max_q, int64_t ranks) {
    return make_case("torch_attn._varlen_attn.default", in,
                     "[$0, $1, $2, $3, $4, " + std::to_string(max_q) + ", " + std::to_string(max_q) +
                         ", true, null, [-1, 0]]",
                     out, "{}", {ranks});
  };
  EXPECT_TRUE(rows(10, 2)->accept({t, L({"S(1)"}), r}, {t, t, t, r, r}));
  EXPECT_TRUE(rows(10, 4)->accept({t, L({"S(1)"}), r}, {t, t, t, r, r}));
  EXPECT_FALSE(rows(20, 4)->accept({t, L({"S(1)"}), r}, {t, t, t, r, r}));
}

TEST(RulesAttention, CausalPricedAtHalfExceptTheMathKernel) {
  const std::string fwd = "aten._scaled_dot_product_flash_attention_for_cpu.default";
  const std::vector<TensorSpec> qkv = {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}};
  const std::vector<TensorMeta> in = {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}};
  const double dense = 4.0 * 2 * 4 * 16 * 16 * 8;
  auto full = make_case(fwd, qkv, "[$0, $1, $2, 0.0, false]", {{{2, 4, 16, 8}}, {{2, 4, 16}}});
  auto causal = make_case(fwd, qkv, "[$0, $1, $2, 0.0, true]", {{{2, 4, 16, 8}}, {{2, 4, 16}}});
  EXPECT_DOUBLE_EQ(full->flops(in, {}), dense);
  EXPECT_DOUBLE_EQ(causal->flops(in, {}), 0.5 * dense);
  // the math kernel materialises the mask and computes every pair
  auto math = make_case("aten._scaled_dot_product_attention_math.default", qkv, "[$0, $1, $2, null, 0.0, true]",
                        {{{2, 4, 16, 8}}, {{2, 4, 16, 16}}});
  EXPECT_DOUBLE_EQ(math->flops(in, {}), dense);
}

TEST(RulesAttention, EfficientAttentionBiasAndPhiloxTensors) {
  // outputs: out, logsumexp, philox_seed, philox_offset (0-d)
  auto c = make_case("aten._scaled_dot_product_efficient_attention.default",
                     {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{1, 4, 16, 16}}}, "[$0, $1, $2, $3, true]",
                     {{{2, 4, 16, 8}}, {{2, 4, 32}}, {{}, "int64"}, {{}, "int64"}});
  EXPECT_EQ(row_set(c->rows()),
            (std::set<std::string>{"S(0),S(0),R,R|S(0),S(0),S(0),R", "S(1),S(1),R,R|S(1),S(1),S(1),S(1)"}));
}

TEST(RulesAttention, BiasBroadcastOverHeadsIsReplicatedInTheHeadRow) {
  // a [B, 1, S, S] bias serves every head: sharded with the batch, replicated with the heads
  auto c = make_case("aten._scaled_dot_product_efficient_attention.default",
                     {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 1, 16, 16}}}, "[$0, $1, $2, $3, true]",
                     {{{2, 4, 16, 8}}, {{2, 4, 32}}, {{}, "int64"}, {{}, "int64"}});
  EXPECT_EQ(row_set(c->rows()),
            (std::set<std::string>{"S(0),S(0),R,R|S(0),S(0),S(0),S(0)", "S(1),S(1),R,R|S(1),S(1),S(1),R"}));
  // the same for cuDNN's kernel (bias at position 3, a debug mask output of rank 1)
  auto d = make_case("aten._scaled_dot_product_cudnn_attention.default",
                     {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{1, 4, 16, 16}}},
                     "[$0, $1, $2, $3, true, 0.0, true, false]",
                     {{{2, 4, 16, 8}}, {{2, 4, 16, 1}}, {{}, ""}, {{}, ""}, {{}, ""}, {{}, ""}, {{}, "int64"}, {{}, "int64"},
                      {{0}}});
  EXPECT_EQ(row_set(d->rows()), (std::set<std::string>{"S(0),S(0),R,R,R,R,R,R,R|S(0),S(0),S(0),R",
                                                       "S(1),S(1),R,R,R,R,R,R,R|S(1),S(1),S(1),S(1)"}));
}

TEST(RulesAttention, BiasOfLowerRankIsShardedOnItsOwnDims) {
  // a [H, S, S] bias broadcasts over the batch: replicated with the batch, S(0) with the heads
  auto c = make_case("aten._scaled_dot_product_efficient_attention.default",
                     {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{4, 16, 16}}}, "[$0, $1, $2, $3, true]",
                     {{{2, 4, 16, 8}}, {{2, 4, 32}}, {{}, "int64"}, {{}, "int64"}});
  EXPECT_EQ(row_set(c->rows()),
            (std::set<std::string>{"S(0),S(0),R,R|S(0),S(0),S(0),R", "S(1),S(1),R,R|S(1),S(1),S(1),S(0)"}));
}

TEST(RulesAttention, EfficientBackwardOwesNoBiasGradientOnABroadcastDim) {
  // grad_out, q, k, v, attn_bias, out, logsumexp, philox_seed, philox_offset -> grad q, k, v, bias
  const std::string args = "[$0, $1, $2, $3, $4, $5, $6, $7, $8, 0.0, [true, true, true, true], true]";
  auto ins = [](std::vector<int64_t> bias) {
    return std::vector<TensorSpec>{{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {bias},
                                   {{2, 4, 16, 8}}, {{2, 4, 32}},   {{}, "int64"},   {{}, "int64"}};
  };
  auto outs = [](std::vector<int64_t> bias) {
    return std::vector<TensorSpec>{{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {bias}};
  };
  // a full-size bias follows both rows, and so does its gradient
  auto full = make_case("aten._scaled_dot_product_efficient_attention_backward.default", ins({2, 4, 16, 16}), args,
                        outs({2, 4, 16, 16}));
  EXPECT_EQ(row_set(full->rows()), (std::set<std::string>{"S(0),S(0),S(0),S(0)|S(0),S(0),S(0),S(0),S(0),S(0),S(0),R,R",
                                                          "S(1),S(1),S(1),S(1)|S(1),S(1),S(1),S(1),S(1),S(1),S(1),R,R"}));
  // broadcast over the batch: each batch shard would hold a partial sum of the bias
  // gradient, so only the head row is left
  auto batch = make_case("aten._scaled_dot_product_efficient_attention_backward.default", ins({1, 4, 16, 16}), args,
                         outs({1, 4, 16, 16}));
  EXPECT_EQ(row_set(batch->rows()),
            (std::set<std::string>{"S(1),S(1),S(1),S(1)|S(1),S(1),S(1),S(1),S(1),S(1),S(1),R,R"}));
  // a lower-rank bias: its gradient is laid out as the bias (S(0) of [H, S, S]), not as q
  auto low = make_case("aten._scaled_dot_product_efficient_attention_backward.default", ins({4, 16, 16}), args,
                       outs({4, 16, 16}));
  EXPECT_EQ(row_set(low->rows()),
            (std::set<std::string>{"S(1),S(1),S(1),S(0)|S(1),S(1),S(1),S(1),S(0),S(1),S(1),R,R"}));
}

TEST(RulesAttention, BackwardWithoutBiasGradientKeepsRowsForABroadcastMask) {
  // the CPU flash backward takes a broadcast causal mask [1, 1, S, S] and returns no gradient
  // for it: every rank reads the whole mask, in the batch and in the head row
  auto c = make_case(
      "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
      {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16}},
       {{1, 1, 16, 16}}},
      "[$0, $1, $2, $3, $4, $5, 0.0, false]", {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}},
      R"({"attn_mask": $6})");
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0),S(0),S(0)|S(0),S(0),S(0),S(0),S(0),S(0),R",
                                                       "S(1),S(1),S(1)|S(1),S(1),S(1),S(1),S(1),S(1),R",
                                                       "S(2),P(sum),P(sum)|S(2),S(2),R,R,S(2),S(2),S(2)"}));
  // a [B, 1, S, S] padding mask: sharded with the batch, whole with the heads
  auto p = make_case(
      "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
      {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16}},
       {{2, 1, 16, 16}}},
      "[$0, $1, $2, $3, $4, $5, 0.0, false]", {{{2, 4, 16, 16}}, {{2, 4, 16, 16}}, {{2, 4, 16, 16}}},
      R"({"attn_mask": $6})");
  EXPECT_EQ(row_set(p->rows()), (std::set<std::string>{"S(0),S(0),S(0)|S(0),S(0),S(0),S(0),S(0),S(0),S(0)",
                                                       "S(1),S(1),S(1)|S(1),S(1),S(1),S(1),S(1),S(1),R",
                                                       "S(2),P(sum),P(sum)|S(2),S(2),R,R,S(2),S(2),S(2)"}));
}

TEST(RulesAttention, SequenceRowGathersKeysAndValues) {
  // context parallelism (all-gather K/V): q, out and logsumexp split the query sequence, k and v
  // whole; with GQA too (2 kv heads, replicated)
  auto c = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 4, 16, 8}}, {{2, 2, 16, 8}}, {{2, 2, 16, 8}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 4, 16, 8}}, {{2, 4, 16}}}, "{}", {4});
  EXPECT_TRUE(row_set(c->rows()).count("S(2),S(2)|S(2),R,R"));
  Layout s = L({"S(2)"}), r = L({"R"});
  EXPECT_TRUE(c->accept({s, s}, {s, r, r}));
  // the local compute: a quarter of the queries against every key, causal: half of that block
  // (each rank's share under the head-tail split, the average one under the contiguous split)
  EXPECT_DOUBLE_EQ(c->flops({{{2, 4, 4, 8}}, {{2, 2, 16, 8}}, {{2, 2, 16, 8}}}, {}), 0.5 * 4.0 * 2 * 4 * 4 * 16 * 8);
  // 18 queries over 4 ranks: the causal offset (coordinate x local length) needs an even split
  auto u = make_case("aten._scaled_dot_product_flash_attention_for_cpu.default",
                     {{{2, 4, 18, 8}}, {{2, 4, 18, 8}}, {{2, 4, 18, 8}}}, "[$0, $1, $2, 0.0, true]",
                     {{{2, 4, 18, 8}}, {{2, 4, 18}}}, "{}", {4});
  EXPECT_FALSE(u->accept({s, s}, {s, r, r}));
  // the efficient kernel has no sequence row (its logsumexp is padded to 32 rows)
  auto e = make_case("aten._scaled_dot_product_efficient_attention.default",
                     {{{2, 4, 16, 8}}, {{2, 4, 16, 8}}, {{2, 4, 16, 8}}}, "[$0, $1, $2, null, true]",
                     {{{2, 4, 16, 8}}, {{2, 4, 32}}, {{}, "int64"}, {{}, "int64"}});
  for (const auto& row : row_set(e->rows())) EXPECT_EQ(row.find("S(2)"), std::string::npos) << row;
}

}  // namespace
}  // namespace autoshard::testing_rules
