// Helpers shared by the op sharding rules (cpp/src/rules/*.cpp): argument access by schema
// position or keyword, dim normalisation, row builders and the reusable row families
// (pointwise with broadcasting, dtype-cast Partial filtering). Owned by the rules engineer;
// anything here that the framework wants to own can move into rules.h later.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "autoshard/rules.h"

namespace autoshard::rule {

// ---- placements -------------------------------------------------------------------------
inline Placement R() { return Placement::replicate(); }
inline Placement S(int d) { return Placement::shard(d); }
inline Placement P(ReduceOp op = ReduceOp::Sum) { return Placement::partial(op); }
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
inline constexpr ReduceOp kLinearReduceOps[] = {ReduceOp::Sum, ReduceOp::Avg};

// ---- errors -----------------------------------------------------------------------------
// Throws std::invalid_argument naming the node, its op and `what` (for unexpected graphs).
[[noreturn]] void rule_error(const RuleContext& ctx, const std::string& what);

// ---- arguments --------------------------------------------------------------------------
// The argument at schema position `pos`, or the keyword argument `name` when the trace passed
// it by name; nullptr when absent (the schema default applies) or explicitly None.
const ArgValue* find_arg(const RuleContext& ctx, size_t pos, const char* name);
int64_t int_arg(const RuleContext& ctx, size_t pos, const char* name, std::optional<int64_t> dflt = {});
double number_arg(const RuleContext& ctx, size_t pos, const char* name, std::optional<double> dflt = {});
bool bool_arg(const RuleContext& ctx, size_t pos, const char* name, std::optional<bool> dflt = {});
std::vector<int64_t> int_list_arg(const RuleContext& ctx, size_t pos, const char* name);
// True when the argument at `pos` is a tensor reference (not None, not a Python number).
bool is_tensor_arg(const RuleContext& ctx, size_t pos, const char* name);
// Index into ctx.inputs (Node::tensor_inputs order) of the tensor at positional argument `pos`
// (the first element when it is a list); -1 when that argument is None / absent / not a tensor.
int tensor_input_index(const RuleContext& ctx, size_t pos);
// Same for a keyword argument (tensor kwargs follow all positional tensors); -1 when absent.
int tensor_kwarg_index(const RuleContext& ctx, const char* name);
// dtype keyword (e.g. _to_copy's dtype=), nullopt when absent.
std::optional<DType> dtype_kwarg(const RuleContext& ctx, const char* name);

// Wraps a possibly negative dim into [0, rank) (rank 0 accepts 0 / -1); throws naming the op.
int wrap_dim(const RuleContext& ctx, int64_t dim, int rank);
// Dims list of a reduction (`dims` argument); empty or absent means "all dims".
std::vector<int> reduction_dims(const RuleContext& ctx, const ArgValue* dims_arg, int rank);

const TensorMeta& input_meta(const RuleContext& ctx, int i);   // throws when missing
const TensorMeta& output_meta(const RuleContext& ctx, int i);  // throws when missing / None

// ---- rows -------------------------------------------------------------------------------
// A row with every output / input Replicate, to be filled in.
ShardingRow replicate_row(const RuleContext& ctx);
// A row with every output and every input set to `p`.
ShardingRow uniform_row(const RuleContext& ctx, Placement p);
// For an op linear in its first input: per linear reduce op (sum, avg), a row with input 0
// and output 0 Partial(op) and the rest Replicate.
void add_partial_first_input_rows(std::vector<ShardingRow>& rows, const RuleContext& ctx);
// Removes exact duplicates and the all-Replicate row (added by the framework), keeping order.
std::vector<ShardingRow> dedup_rows(std::vector<ShardingRow> rows);

// Right-aligned broadcast map: for output dim `out_dim` of an output of rank `out_rank`, the dim
// of an input of shape `in_shape` it reads from, or -1 when that input is broadcast there
// (missing dim, or size 1 while the output size is not 1).
int broadcast_source_dim(const std::vector<int64_t>& out_shape, int out_dim, const std::vector<int64_t>& in_shape);

// Pointwise shard rows: for every dim of the (first) output, every output sharded there and
// every tensor input sharded on the matching non-broadcast dim (R where broadcast).
std::vector<ShardingRow> pointwise_shard_rows(const RuleContext& ctx);

// Whether Partial(op) survives a cast from `from` to `to` (sum/avg only between floating types
// or from integers to non-bool; max/min through any non-decreasing cast except to bool).
bool partial_survives_cast(ReduceOp op, DType from, DType to);

// Local size of a dim of global size `size` split over `shards` ranks with chunk semantics:
// true when every rank gets the same size (divisible).
inline bool divides(int64_t size, int64_t shards) { return shards <= 1 || (size % shards) == 0; }
// Product of the mesh sizes whose placement in `layout` shards tensor dim `dim`.
int64_t shards_on_dim(const Mesh& mesh, const Layout& layout, int dim);

// Smallest local size of tensor dim `dim` (global `size`) over all ranks, splitting with chunk
// semantics mesh dim by mesh dim in order (as DTensor does): 4 over 3 ranks gives 2,2,0 -> 0.
int64_t min_local_size(int64_t size, const Mesh& mesh, const Layout& layout, int dim);
// True when some rank holds an empty block of `meta` under `layout` (kernels such as the CPU
// flash attention crash on empty inputs, and max/min of nothing is undefined).
bool has_empty_shard(const Mesh& mesh, const Layout& layout, const TensorMeta& meta);

// ---- registration -----------------------------------------------------------------------
void add_rule(const std::string& op, OpRule rule);
void add_rules(std::initializer_list<const char*> ops, const OpRule& rule);
// A rule from its rows alone for an op with no FLOPs: factories, index ops, views
// (`is_view`: moves no data, so no compute cost either).
OpRule memory_bound_rule(std::function<std::vector<ShardingRow>(const RuleContext&)> rows, bool is_view = false);

// ---- flops helpers ----------------------------------------------------------------------
double numel_of(const TensorMeta& m);

}  // namespace autoshard::rule
