// Per-GPU bytes of sharded tensors and of the training state (parameters, gradients,
// optimizer moments, master weights).
#include <limits>
#include <stdexcept>
#include <string>

#include "autoshard/memory_model.h"

namespace autoshard {
namespace {

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a)
    throw std::invalid_argument(std::string(what) + ": size exceeds 64 bits");
  return a * b;
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::vector<int64_t> shard_counts(const Layout& layout, const std::vector<int64_t>& mesh_shape, int tensor_rank) {
  if (layout.size() != mesh_shape.size())
    throw std::invalid_argument("layout has " + std::to_string(layout.size()) + " placements but the mesh has " +
                                std::to_string(mesh_shape.size()) + " dims");
  if (tensor_rank < 0) throw std::invalid_argument("shard_counts: tensor rank must be >= 0");
  std::vector<int64_t> counts(static_cast<size_t>(tensor_rank), 1);
  for (size_t m = 0; m < layout.size(); ++m) {
    if (mesh_shape[m] < 1)
      throw std::invalid_argument("mesh dim " + std::to_string(m) + " has size " + std::to_string(mesh_shape[m]));
    if (!layout[m].is_shard()) continue;
    int d = layout[m].dim;
    if (d < 0 || d >= tensor_rank)
      throw std::invalid_argument("placement S(" + std::to_string(d) + ") on mesh dim " + std::to_string(m) +
                                  " is outside a tensor of rank " + std::to_string(tensor_rank));
    counts[static_cast<size_t>(d)] = checked_mul(counts[static_cast<size_t>(d)], mesh_shape[m], "shard_counts");
  }
  return counts;
}

std::vector<int64_t> local_shard_shape(const std::vector<int64_t>& global_shape, const std::vector<int64_t>& counts) {
  if (global_shape.size() != counts.size())
    throw std::invalid_argument("local_shard_shape: shape " + shape_str(global_shape) + " and shard counts " +
                                shape_str(counts) + " differ in length");
  std::vector<int64_t> local(global_shape.size());
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (global_shape[d] < 0)
      throw std::invalid_argument("local_shard_shape: shape " + shape_str(global_shape) + " has a negative dim");
    if (counts[d] < 1)
      throw std::invalid_argument("local_shard_shape: shard count " + std::to_string(counts[d]) + " on dim " +
                                  std::to_string(d) + " must be >= 1");
    local[d] = global_shape[d] / counts[d] + (global_shape[d] % counts[d] != 0 ? 1 : 0);
  }
  return local;
}

int64_t local_shard_bytes(const std::vector<int64_t>& global_shape, DType dtype, const std::vector<int64_t>& counts) {
  int64_t numel = 1;
  for (int64_t s : local_shard_shape(global_shape, counts)) numel = checked_mul(numel, s, "local_shard_bytes");
  return checked_mul(numel, dtype_bytes(dtype), "local_shard_bytes");
}

int64_t local_shard_bytes(const TensorMeta& meta, const Layout& layout, const std::vector<int64_t>& mesh_shape) {
  return local_shard_bytes(meta.shape, meta.dtype,
                           shard_counts(layout, mesh_shape, static_cast<int>(meta.shape.size())));
}

TrainingStateBytes training_state_bytes(int64_t local_numel, DType param_dtype, DType grad_dtype,
                                        const OptimizerConfig& optimizer) {
  if (local_numel < 0)
    throw std::invalid_argument("training_state_bytes: local_numel must be >= 0, got " + std::to_string(local_numel));
  TrainingStateBytes t;
  t.parameters = checked_mul(local_numel, dtype_bytes(param_dtype), "training_state_bytes");
  if (optimizer.has_gradients) t.gradients = checked_mul(local_numel, dtype_bytes(grad_dtype), "training_state_bytes");
  int moments = 0;
  switch (optimizer.kind) {
    case OptimizerKind::None:
    case OptimizerKind::SGD:
      moments = 0;
      break;
    case OptimizerKind::SGDMomentum:
      moments = 1;
      break;  // momentum_buffer
    case OptimizerKind::Adam:
      moments = 2;
      break;  // exp_avg, exp_avg_sq
  }
  t.optimizer_state =
      checked_mul(local_numel, int64_t{moments} * dtype_bytes(optimizer.state_dtype), "training_state_bytes");
  if (optimizer.fp32_master_weights && optimizer.kind != OptimizerKind::None && dtype_bytes(param_dtype) < 4)
    t.master_weights = checked_mul(local_numel, 4, "training_state_bytes");
  return t;
}

TrainingStateBytes training_state_bytes(int64_t local_numel, DType param_dtype, const OptimizerConfig& optimizer) {
  return training_state_bytes(local_numel, param_dtype, param_dtype, optimizer);
}

}  // namespace autoshard
