// Loss, embedding, factory, indexing and slicing rules; registry coverage of the traced ops.
#include "test_rules_util.h"

namespace autoshard::testing_rules {
namespace {

TEST(RulesLoss, NllMeanForwardIsReplicateOnlySumIsPartial) {
  auto mean = make_case("aten.nll_loss_forward.default", {{{32, 100}}, {{32}, "int64"}}, "[$0, $1, null, 1, -100]",
                        {{{}}, {{}}});
  EXPECT_TRUE(mean->rows().empty());
  auto sum = make_case("aten.nll_loss_forward.default", {{{32, 100}}, {{32}, "int64"}}, "[$0, $1, null, 2, -100]",
                       {{{}}, {{}}});
  EXPECT_EQ(row_set(sum->rows()), (std::set<std::string>{"P(sum),P(sum)|S(0),S(0)"}));
  auto none = make_case("aten.nll_loss_forward.default", {{{32, 100}}, {{32}, "int64"}}, "[$0, $1, null, 0, -100]",
                        {{{32}}, {{}}});
  EXPECT_EQ(row_set(none->rows()), (std::set<std::string>{"S(0),R|S(0),S(0)"}));
}

TEST(RulesLoss, NllBackwardIsBatchShardedWithReplicatedScalars) {
  auto c = make_case("aten.nll_loss_backward.default", {{{}}, {{32, 100}}, {{32}, "int64"}, {{}}},
                     "[$0, $1, $2, null, 1, -100, $3]", {{{32, 100}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(0)|R,S(0),S(0),R"}));
}

TEST(RulesEmbedding, ForwardAndBackward) {
  auto f = make_case("aten.embedding.default", {{{100, 64}}, {{2, 16}, "int64"}}, "[$0, $1]", {{{2, 16, 64}}});
  EXPECT_EQ(row_set(f->rows()), (std::set<std::string>{"S(2)|S(1),R", "S(0)|R,S(0)", "S(1)|R,S(1)"}));
  auto b = make_case("aten.embedding_dense_backward.default", {{{2, 16, 64}}, {{2, 16}, "int64"}},
                     "[$0, $1, 100, -1, false]", {{{100, 64}}});
  EXPECT_EQ(row_set(b->rows()),
            (std::set<std::string>{"S(1)|S(2),R", "P(sum)|S(0),S(0)", "P(sum)|S(1),S(1)", "P(sum)|P(sum),R"}));
  auto freq = make_case("aten.embedding_dense_backward.default", {{{2, 16, 64}}, {{2, 16}, "int64"}},
                        "[$0, $1, 100, -1, true]", {{{100, 64}}});
  EXPECT_EQ(row_set(freq->rows()), (std::set<std::string>{"S(1)|S(2),R", "P(sum)|P(sum),R"}));
}

TEST(RulesFactory, ConstantsNeverInheritPartialSum) {
  auto z = make_case("aten.new_zeros.default", {{{16, 2}}}, "[$0, [16, 4]]", {{{16, 4}}});
  for (const auto& r : z->rows()) EXPECT_FALSE(r.outputs[0].is_partial()) << row_str(r);
  EXPECT_TRUE(row_set(z->rows()).count("R|S(0)"));  // shape differs: fresh replicated zeros
  auto e = make_case("aten.new_empty_strided.default", {{{8, 4}}}, "[$0, [8, 4], [4, 1]]", {{{8, 4}}});
  EXPECT_TRUE(row_set(e->rows()).count("P(sum)|P(sum)"));
  auto zl = make_case("aten.zeros_like.default", {{{8, 4}}}, "[$0]", {{{8, 4}}});
  EXPECT_EQ(row_set(zl->rows()),
            (std::set<std::string>{"S(0)|S(0)", "S(1)|S(1)", "R|P(sum)", "R|P(avg)", "R|P(max)", "R|P(min)"}));
  auto f = make_case("aten.zeros.default", {}, "[[4, 32]]", {{{4, 32}}});
  EXPECT_TRUE(f->rows().empty());
}

TEST(RulesIndexing, GatherChecksSizesNotJustRank) {
  // gather(probs[16,4], 1, idx[16,2]): dim 0 sizes agree -> shardable; dim 1 is the gather dim.
  auto c = make_case("aten.gather.default", {{{16, 4}}, {{16, 2}, "int64"}}, "[$0, 1, $1]", {{{16, 2}}});
  EXPECT_EQ(row_set(c->rows()), (std::set<std::string>{"S(1)|R,S(1)", "S(0)|S(0),S(0)"}));
  auto d = make_case("aten.gather.default", {{{16, 4}}, {{8, 2}, "int64"}}, "[$0, 1, $1]", {{{8, 2}}});
  EXPECT_EQ(row_set(d->rows()), (std::set<std::string>{"S(1)|R,S(1)"}));
}

TEST(RulesIndexing, IndexTensorAndIndexAdd) {
  // x[16,32][idx[4]] -> [4,32]
  auto c = make_case("aten.index.Tensor", {{{16, 32}}, {{4}, "int64"}}, "[$0, [$1]]", {{{4, 32}}});
  EXPECT_EQ(row_set(c->rows()),
            (std::set<std::string>{"S(1)|S(1),R", "S(0)|R,S(0)", "P(sum)|P(sum),R", "P(avg)|P(avg),R"}));
  // x[:, idx] with x [8,16,32], idx [4] -> [8,4,32]
  auto m = make_case("aten.index.Tensor", {{{8, 16, 32}}, {{4}, "int64"}}, "[$0, [null, $1]]", {{{8, 4, 32}}});
  auto rows = row_set(m->rows());
  EXPECT_TRUE(rows.count("S(0)|S(0),R"));
  EXPECT_TRUE(rows.count("S(2)|S(2),R"));
  EXPECT_TRUE(rows.count("S(1)|R,S(0)"));
  auto a =
      make_case("aten.index_add.default", {{{4, 32}}, {{16}, "int64"}, {{16, 32}}}, "[$0, 0, $1, $2]", {{{4, 32}}});
  EXPECT_EQ(row_set(a->rows()), (std::set<std::string>{"S(1)|S(1),R,S(1)", "P(sum)|P(sum),R,P(sum)"}));
}

TEST(RulesSlicing, CatSplitSelectSlice) {
  auto cat = make_case("aten.cat.default", {{{0}}, {{2, 4, 16, 16}}}, "[[$0, $1], -2]", {{{2, 4, 16, 16}}});
  auto rows = row_set(cat->rows());
  EXPECT_TRUE(rows.count("S(0)|R,S(0)"));
  EXPECT_FALSE(rows.count("S(2)|R,S(2)"));
  auto split =
      make_case("aten.split.Tensor", {{{2, 16, 192}}}, "[$0, 64, 2]", {{{2, 16, 64}}, {{2, 16, 64}}, {{2, 16, 64}}});
  EXPECT_TRUE(row_set(split->rows()).count("S(1),S(1),S(1)|S(1)"));
  EXPECT_FALSE(row_set(split->rows()).count("S(2),S(2),S(2)|S(2)"));
  auto sel = make_case("aten.select.int", {{{4, 32, 64}}}, "[$0, 0, 1]", {{{32, 64}}});
  EXPECT_TRUE(row_set(sel->rows()).count("S(1)|S(2)"));
  EXPECT_FALSE(row_set(sel->rows()).count("S(0)|S(0)"));
  auto full = make_case("aten.slice.Tensor", {{{2, 4, 16, 16}}}, "[$0, 2, 0, 16]", {{{2, 4, 16, 16}}});
  EXPECT_TRUE(row_set(full->rows()).count("S(2)|S(2)"));  // full-range slice is the identity
  auto part =
      make_case("aten.slice.Tensor", {{{2, 17}, "int64"}}, "[$0, 1, 1, 9223372036854775807]", {{{2, 16}, "int64"}});
  EXPECT_FALSE(row_set(part->rows()).count("S(1)|S(1)"));
  auto sb = make_case("aten.select_backward.default", {{{64, 32}}}, "[$0, [4, 64, 32], 0, 3]", {{{4, 64, 32}}});
  EXPECT_TRUE(row_set(sb->rows()).count("S(1)|S(0)"));
  auto pad =
      make_case("aten.constant_pad_nd.default", {{{2, 16}, "int64"}}, "[$0, [0, 1], -100.0]", {{{2, 17}, "int64"}});
  EXPECT_EQ(row_set(pad->rows()),
            (std::set<std::string>{"S(0)|S(0)", "P(avg)|P(avg)", "P(max)|P(max)", "P(min)|P(min)"}));
}

TEST(RulesSlicing, SelectAndSliceScatter) {
  // T5's shift-right: ids[..., 1:] = x[..., :-1]; ids[..., 0] = start
  auto sl = make_case("aten.slice_scatter.default", {{{8, 16}, "int64"}, {{8, 15}, "int64"}},
                      "[$0, $1, 1, 1, 9223372036854775807]", {{{8, 16}, "int64"}});
  EXPECT_EQ(row_set(sl->rows()),
            (std::set<std::string>{"S(0)|S(0),S(0)", "P(sum)|P(sum),P(sum)", "P(avg)|P(avg),P(avg)",
                                   "P(max)|P(max),P(max)", "P(min)|P(min),P(min)"}));
  auto full = make_case("aten.slice_scatter.default", {{{8, 16}}, {{8, 16}}}, "[$0, $1, 1]", {{{8, 16}}});
  EXPECT_TRUE(row_set(full->rows()).count("S(1)|S(1),S(1)"));
  auto se = make_case("aten.select_scatter.default", {{{8, 4, 16}}, {{8, 16}}}, "[$0, $1, 1, 0]", {{{8, 4, 16}}});
  auto rows = row_set(se->rows());
  EXPECT_TRUE(rows.count("S(0)|S(0),S(0)"));
  EXPECT_TRUE(rows.count("S(2)|S(2),S(1)"));
  EXPECT_FALSE(rows.count("S(1)|S(1),S(1)"));
}

TEST(RulesFactory, FillTensorFollowsTheShapeAndTheValue) {
  auto f = make_case("aten.fill.Tensor", {{{8}, "int64"}, {{}, "int64"}}, "[$0, $1]", {{{8}, "int64"}});
  auto rows = row_set(f->rows());
  EXPECT_TRUE(rows.count("S(0)|S(0),R"));
  EXPECT_TRUE(rows.count("P(sum)|R,P(sum)"));
  EXPECT_TRUE(rows.count("R|P(sum),R"));
  EXPECT_FALSE(rows.count("P(sum)|P(sum),R"));  // the value, not x, gives the result
}

TEST(RulesRegistry, EveryTracedOpHasARule) {
  // Op names seen in joint graphs of the MLP, Llama-style, GPT-2 and MoE probes.
  register_all_rules();
  for (const char* op :
       {"aten._log_softmax.default", "aten._log_softmax_backward_data.default", "aten._safe_softmax.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "aten._softmax.default",
        "aten._softmax_backward_data.default", "aten._to_copy.default", "aten._unsafe_view.default", "aten.add.Tensor",
        "aten.addmm.default", "aten.alias.default", "aten.all.default", "aten.arange.default", "aten.bmm.default",
        "aten.cat.default", "aten.clone.default", "aten.constant_pad_nd.default", "aten.detach.default",
        "aten.div.Scalar", "aten.div.Tensor", "aten.embedding.default", "aten.embedding_dense_backward.default",
        "aten.eq.Scalar", "aten.eq.Tensor", "aten.expand.default", "aten.gather.default", "aten.ge.Scalar",
        "aten.gelu.default", "aten.gelu_backward.default", "aten.index.Tensor", "aten.index_add.default",
        "aten.lift_fresh_copy.default", "aten.lt.Scalar", "aten.mean.default", "aten.mean.dim", "aten.mm.default",
        "aten.mul.Scalar", "aten.mul.Tensor", "aten.native_dropout.default", "aten.native_dropout_backward.default",
        "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default", "aten.neg.default",
        "aten.new_zeros.default", "aten.nll_loss_backward.default", "aten.nll_loss_forward.default",
        "aten.ones.default", "aten.pow.Tensor_Scalar", "aten.relu.default", "aten.remainder.Scalar",
        "aten.rsqrt.default", "aten.scalar_tensor.default", "aten.scatter.src", "aten.scatter_add.default",
        "aten.select.int", "aten.select_backward.default", "aten.silu.default", "aten.silu_backward.default",
        "aten.slice.Tensor", "aten.sort.default", "aten.split.Tensor", "aten.sum.default", "aten.sum.dim_IntList",
        "aten.t.default", "aten.tanh.default", "aten.tanh_backward.default", "aten.threshold_backward.default",
        "aten.topk.default", "aten.transpose.int", "aten.tril.default", "aten.unsqueeze.default", "aten.view.default",
        "aten.where.self", "aten.zeros.default", "aten.zeros_like.default", "aten._assert_async.msg",
        "aten._scaled_dot_product_flash_attention.default", "aten._scaled_dot_product_flash_attention_backward.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_efficient_attention_backward.default", "aten.baddbmm.default", "aten.permute.default",
        "aten.reshape.default", "aten.squeeze.dim", "aten.stack.default", "aten.split_with_sizes.default",
        "aten.amax.default", "aten.index_select.default", "aten.copy.default", "aten.full.default",
        "aten.empty.memory_format", "aten.new_empty_strided.default", "aten.ones_like.default",
        "aten.full_like.default", "aten.sigmoid.default", "aten.exp.default", "aten.sqrt.default", "aten.sub.Tensor",
        "aten.cos.default", "aten.sin.default", "aten.index_put.default",
        // Hugging Face families (tools/hf_coverage.py): convolutions, MoE routing, losses, T5
        "aten.convolution.default", "aten.convolution_backward.default", "aten.histc.default",
        "aten._grouped_mm.default", "transformers.grouped_mm_fallback.default",
        "transformers.grouped_mm_fallback_backward.default", "aten.mse_loss.default", "aten.mse_loss_backward.default",
        "aten.binary_cross_entropy_with_logits.default", "aten.smooth_l1_loss.default",
        "aten.huber_loss_backward.default", "aten.fill.Tensor", "aten.select_scatter.default",
        "aten.slice_scatter.default"})
    EXPECT_NE(RuleRegistry::instance().find(op), nullptr) << op;
}

}  // namespace
}  // namespace autoshard::testing_rules
