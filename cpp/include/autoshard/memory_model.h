// Memory model: bytes a GPU holds for a sharded tensor, for parameters with their gradients
// and optimizer state, and the live intervals of a graph's tensors (for IOPDDL-style memory
// constraints: at every step, the bytes of all live tensors must fit the limit).
#pragma once

#include <cstdint>
#include <vector>

#include "autoshard/cost_model.h"
#include "autoshard/graph.h"
#include "autoshard/placement.h"

namespace autoshard {

// ---- Sharded tensors (torch.chunk semantics) ----

// How many pieces each tensor dim is split into under `layout` on a mesh of `mesh_shape`:
// the product of the sizes of the mesh dims that Shard that tensor dim. Replicate and Partial
// do not divide. Throws std::invalid_argument when the layout length differs from the mesh's
// number of dims or a Shard dim is outside [0, tensor_rank).
std::vector<int64_t> shard_counts(const Layout& layout, const std::vector<int64_t>& mesh_shape, int tensor_rank);

// The largest local shard's shape: ceil(global / count) per dim (torch.chunk gives the first
// shards ceil-sized; nested splits over several mesh dims give the same ceil, since
// ceil(ceil(a/b)/c) == ceil(a/(b*c))). Throws on a length mismatch or a count < 1.
std::vector<int64_t> local_shard_shape(const std::vector<int64_t>& global_shape,
                                       const std::vector<int64_t>& shard_counts);
// Bytes of that largest shard: what every GPU must be able to hold.
int64_t local_shard_bytes(const std::vector<int64_t>& global_shape, DType dtype,
                          const std::vector<int64_t>& shard_counts);
// Convenience: local_shard_bytes(shape, dtype, shard_counts(layout, mesh_shape, rank)).
int64_t local_shard_bytes(const TensorMeta& meta, const Layout& layout, const std::vector<int64_t>& mesh_shape);

// ---- Parameters, gradients, optimizer state ----

enum class OptimizerKind {
  None,         // no optimizer state (inference or a frozen parameter)
  SGD,          // plain SGD: no state
  SGDMomentum,  // one momentum buffer
  Adam,         // Adam / AdamW: exp_avg and exp_avg_sq
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Adam;
  DType state_dtype = DType::Float32;  // dtype of the moment buffers (fp32 under mixed precision)
  // Mixed precision with low-precision stored parameters keeps an fp32 "master" copy for the
  // update. Counted only when the parameter dtype is narrower than 4 bytes (an fp32 parameter
  // is its own master copy).
  bool fp32_master_weights = false;
  bool has_gradients = true;  // false for frozen parameters
};

struct TrainingStateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t master_weights = 0;
  int64_t total() const { return parameters + gradients + optimizer_state + master_weights; }
};

// Per-GPU bytes for `local_numel` parameter elements (the local shard's numel) stored in
// `param_dtype`, with gradients in `grad_dtype`. The per-parameter Adam `step` counter
// (a 4-byte scalar) is ignored.
TrainingStateBytes training_state_bytes(int64_t local_numel, DType param_dtype, DType grad_dtype,
                                        const OptimizerConfig& optimizer = {});
// Gradients in the parameter's dtype.
TrainingStateBytes training_state_bytes(int64_t local_numel, DType param_dtype, const OptimizerConfig& optimizer = {});

// ---- Live intervals ----

// Half-open span of execution steps [start, end) during which a tensor occupies memory. Step i
// is the execution of node i (graph order is execution order).
struct LiveInterval {
  int64_t start = 0;
  int64_t end = 0;
  bool operator==(const LiveInterval& o) const { return start == o.start && end == o.end; }
};

// The core rule on plain data: a tensor defined at step `def` and read at steps `uses` lives in
// [def, max(uses) + 1), at least [def, def + 1); one that must survive the graph (an output)
// lives to `num_steps`. Throws when a use precedes the definition or a step is out of range.
LiveInterval live_interval(int64_t def, const std::vector<int64_t>& uses, bool live_to_end, int64_t num_steps);

struct LiveIntervalOptions {
  // Parameters and buffers are persistent state: they occupy memory for the whole step.
  bool persistent_state_whole_step = true;
  // Graph outputs (loss, gradients) leave the graph alive: they live to the last step.
  bool outputs_live_to_end = true;
};

// One interval per output of every node: result[node][output]. None outputs get {def, def}
// (empty). Uses are the tensor references in the consumers' args and kwargs (lists included).
std::vector<std::vector<LiveInterval>> graph_live_intervals(const Graph& graph,
                                                            const LiveIntervalOptions& options = {});

// Peak over steps of the summed bytes of the live tensors: bytes[i] belongs to intervals[i].
int64_t peak_live_bytes(const std::vector<LiveInterval>& intervals, const std::vector<int64_t>& bytes);

}  // namespace autoshard
