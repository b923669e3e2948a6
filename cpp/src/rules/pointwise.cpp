// Pointwise ops (with broadcasting), casts and identity copies.
//
// Shard rows: every output dim d can be sharded; each tensor input is sharded on the dim that
// feeds d, or Replicate where it is broadcast (missing or size-1 dim).
// Partial rows, by the algebra of the op (the runtime runs these through DTensor, whose
// pointwise rules have the same rows, so nothing here needs a custom runtime path):
//   add/sub (two tensors): P(sum)+P(sum), P(avg)+P(avg), P(avg|max|min)+R, R+P(avg).
//     Never P(sum)+R (the R operand would be added once per rank) and never a Partial
//     through add/sub with a Python number (DTensor keeps no Partial there).
//   mul (two tensors): Partial(sum|avg) through either operand with the other R.
//   mul / div by a number (mul.Scalar, div.Scalar, mul.Tensor(x, 0.5)): P(sum), P(avg).
//   div (two tensors): P(sum|avg) numerator with R denominator.
//   neg: P(sum), P(avg), P(max)->P(min), P(min)->P(max).
//   non-decreasing unary (exp, relu, sigmoid, tanh, erf, ...): P(max), P(min).
//   identity copies (clone, detach, alias, contiguous, lift_fresh_copy) and complex
//     conjugation (_conj, conj_physical, resolve_conj): every Partial.
//   casts (_to_copy, convert_element_type, copy): only the Partial kinds that commute with the
//     cast (DTensor's own rule wrongly kept P(sum) through float->int/bool casts).
//   everything else (silu, gelu, rsqrt, pow, comparisons, *_backward, where, ...): none.
#include <string>

#include "autoshard/rule_helpers.h"

namespace autoshard {
namespace {

using namespace rule;

enum class PartialClass {
  None,
  Additive,
  Mul,
  Div,
  ScalarLinear,
  Neg,
  NonDecreasing,
  NonIncreasing,
  Identity,
  Cast,
  Copy,
  MaxPreserving,
  MinPreserving
};

void add_uniform(std::vector<ShardingRow>& rows, const RuleContext& ctx, Placement out, std::vector<Placement> ins) {
  if (ins.size() != ctx.inputs.size()) return;  // e.g. a binary rule on a call with a number operand
  ShardingRow r;
  r.outputs.assign(ctx.outputs.size(), out);
  r.inputs = std::move(ins);
  rows.push_back(std::move(r));
}

std::vector<ShardingRow> pointwise_rows(const RuleContext& ctx, PartialClass cls) {
  std::vector<ShardingRow> rows = pointwise_shard_rows(ctx);
  const Placement Ps = P(ReduceOp::Sum), Pa = P(ReduceOp::Avg), Pmax = P(ReduceOp::Max), Pmin = P(ReduceOp::Min);
  switch (cls) {
    case PartialClass::None:
      break;
    case PartialClass::Additive:
      add_uniform(rows, ctx, Ps, {Ps, Ps});
      add_uniform(rows, ctx, Pa, {Pa, Pa});
      add_uniform(rows, ctx, Pa, {Pa, R()});
      add_uniform(rows, ctx, Pmax, {Pmax, R()});
      add_uniform(rows, ctx, Pmin, {Pmin, R()});
      add_uniform(rows, ctx, Pa, {R(), Pa});
      break;
    case PartialClass::Mul:
      for (ReduceOp op : kLinearReduceOps) {
        add_uniform(rows, ctx, P(op), {P(op)});  // multiplication by a Python number
        add_uniform(rows, ctx, P(op), {P(op), R()});
        add_uniform(rows, ctx, P(op), {R(), P(op)});
      }
      break;
    case PartialClass::Div:
      for (ReduceOp op : kLinearReduceOps) {
        add_uniform(rows, ctx, P(op), {P(op)});
        add_uniform(rows, ctx, P(op), {P(op), R()});
      }
      break;
    case PartialClass::ScalarLinear:
      for (ReduceOp op : kLinearReduceOps) add_uniform(rows, ctx, P(op), {P(op)});
      break;
    case PartialClass::Neg:
      add_uniform(rows, ctx, Ps, {Ps});
      add_uniform(rows, ctx, Pa, {Pa});
      add_uniform(rows, ctx, Pmin, {Pmax});
      add_uniform(rows, ctx, Pmax, {Pmin});
      break;
    case PartialClass::NonDecreasing:
      add_uniform(rows, ctx, Pmax, {Pmax});
      add_uniform(rows, ctx, Pmin, {Pmin});
      break;
    case PartialClass::NonIncreasing:
      add_uniform(rows, ctx, Pmin, {Pmax});
      add_uniform(rows, ctx, Pmax, {Pmin});
      break;
    case PartialClass::MaxPreserving:
    case PartialClass::MinPreserving: {
      ReduceOp keep = cls == PartialClass::MaxPreserving ? ReduceOp::Max : ReduceOp::Min;
      for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
        add_uniform(rows, ctx, P(op), {P(op), R()});
        add_uniform(rows, ctx, P(op), {R(), P(op)});
      }
      add_uniform(rows, ctx, P(keep), {P(keep), P(keep)});
      break;
    }
    case PartialClass::Identity:
      for (ReduceOp op : kAllReduceOps) rows.push_back(uniform_row(ctx, P(op)));
      break;
    case PartialClass::Cast: {
      // _to_copy(x, dtype=...) / convert_element_type(x, dtype): compare input and output dtypes.
      const DType from = input_meta(ctx, 0).dtype, to = output_meta(ctx, 0).dtype;
      for (ReduceOp op : kAllReduceOps)
        if (partial_survives_cast(op, from, to)) rows.push_back(uniform_row(ctx, P(op)));
      break;
    }
    case PartialClass::Copy: {
      // copy(dst, src): the values are src's, cast to dst's dtype; dst only gives the shape.
      if (ctx.inputs.size() != 2) break;
      const DType from = input_meta(ctx, 1).dtype, to = output_meta(ctx, 0).dtype;
      for (ReduceOp op : kAllReduceOps)
        if (partial_survives_cast(op, from, to)) rows.push_back(uniform_row(ctx, P(op)));
      break;
    }
  }
  return dedup_rows(std::move(rows));
}

OpRule pointwise_rule(PartialClass cls) {
  OpRule r;
  r.rows = [cls](const RuleContext& ctx) { return pointwise_rows(ctx, cls); };
  r.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) { return 0.0; };
  return r;
}

// native_dropout(x, p, train) -> (out, mask): random, so shard rows only (a Partial input would
// drop different elements of each partial term; DTensor reduces first as well).
std::vector<ShardingRow> dropout_rows(const RuleContext& ctx) { return dedup_rows(pointwise_shard_rows(ctx)); }

}  // namespace

void register_pointwise_rules() {
  add_rules({"aten.add.Tensor", "aten.sub.Tensor"}, pointwise_rule(PartialClass::Additive));
  add_rules({"aten.mul.Tensor"}, pointwise_rule(PartialClass::Mul));
  add_rules({"aten.div.Tensor"}, pointwise_rule(PartialClass::Div));
  add_rules({"aten.mul.Scalar", "aten.div.Scalar"}, pointwise_rule(PartialClass::ScalarLinear));
  add_rules({"aten.neg.default"}, pointwise_rule(PartialClass::Neg));
  add_rules({"aten.exp.default", "aten.relu.default", "aten.sigmoid.default", "aten.tanh.default", "aten.erf.default",
             "aten.expm1.default", "aten.exp2.default", "aten.floor.default", "aten.ceil.default", "aten.trunc.default",
             "aten.round.default", "aten.sign.default", "aten.sgn.default", "aten.atan.default", "aten.asinh.default",
             "aten.sinh.default", "aten.nan_to_num.default"},
            pointwise_rule(PartialClass::NonDecreasing));
  add_rules({"aten.erfc.default"}, pointwise_rule(PartialClass::NonIncreasing));
  add_rules({"aten.maximum.default", "aten.fmax.default", "aten.clamp_min.Tensor"},
            pointwise_rule(PartialClass::MaxPreserving));
  add_rules({"aten.minimum.default", "aten.fmin.default", "aten.clamp_max.Tensor"},
            pointwise_rule(PartialClass::MinPreserving));
  OpRule identity = pointwise_rule(PartialClass::Identity);
  add_rules({"aten.clone.default", "aten.lift_fresh_copy.default", "aten.contiguous.default", "aten.positive.default"},
            identity);
  OpRule identity_view = identity;
  identity_view.is_view = true;
  add_rules({"aten.alias.default", "aten.detach.default"}, identity_view);  // no data moved
  // complex conjugation (complex rotary embeddings' backward): linear, so sums stay Partial;
  // _conj only flips the conjugate bit, conj_physical / resolve_conj write the values
  add_rules({"aten._conj.default"}, identity_view);
  add_rules({"aten.conj_physical.default", "aten.resolve_conj.default"}, identity);
  add_rules({"aten._to_copy.default", "prims.convert_element_type.default", "aten.to.dtype"},
            pointwise_rule(PartialClass::Cast));
  add_rules({"aten.copy.default"}, pointwise_rule(PartialClass::Copy));
  add_rules({"aten.silu.default",
             "aten.gelu.default",
             "aten.rsqrt.default",
             "aten.sqrt.default",
             "aten.log.default",
             "aten.log1p.default",
             "aten.log2.default",
             "aten.abs.default",
             "aten.cos.default",
             "aten.sin.default",
             "aten.tan.default",
             "aten.reciprocal.default",
             "aten.square.default",
             "aten.pow.Tensor_Scalar",
             "aten.pow.Tensor_Tensor",
             "aten.pow.Scalar",
             "aten.add.Scalar",
             "aten.sub.Scalar",
             "aten.rsub.Scalar",
             "aten.rsub.Tensor",
             "aten.remainder.Scalar",
             "aten.remainder.Tensor",
             "aten.fmod.Scalar",
             "aten.fmod.Tensor",
             "aten.floor_divide.default",
             "aten.div.Tensor_mode",
             "aten.clamp.default",
             "aten.clamp.Tensor",
             "aten.clamp_min.default",
             "aten.clamp_max.default",
             "aten.threshold.default",
             "aten.eq.Scalar",
             "aten.eq.Tensor",
             "aten.ne.Scalar",
             "aten.ne.Tensor",
             "aten.lt.Scalar",
             "aten.lt.Tensor",
             "aten.le.Scalar",
             "aten.le.Tensor",
             "aten.gt.Scalar",
             "aten.gt.Tensor",
             "aten.ge.Scalar",
             "aten.ge.Tensor",
             "aten.logical_not.default",
             "aten.logical_and.default",
             "aten.logical_or.default",
             "aten.logical_xor.default",
             "aten.bitwise_not.default",
             "aten.bitwise_and.Tensor",
             "aten.bitwise_or.Tensor",
             "aten.isnan.default",
             "aten.isinf.default",
             "aten.where.self",
             "aten.masked_fill.Scalar",
             "aten.masked_fill.Tensor",
             "aten.lerp.Scalar",
             "aten.lerp.Tensor",
             "aten.addcmul.default",
             "aten.addcdiv.default",
             "aten.threshold_backward.default",
             "aten.gelu_backward.default",
             "aten.silu_backward.default",
             "aten.tanh_backward.default",
             "aten.sigmoid_backward.default",
             "aten.native_dropout_backward.default",
             "aten.erfinv.default",
             "aten.logit.default",
             "aten.xlogy.Tensor"},
            pointwise_rule(PartialClass::None));
  OpRule dropout;
  dropout.rows = dropout_rows;
  dropout.flops = [](const RuleContext&, const std::vector<TensorMeta>&, const std::vector<TensorMeta>&) {
    return 0.0;
  };
  add_rule("aten.native_dropout.default", dropout);
}

}  // namespace autoshard
