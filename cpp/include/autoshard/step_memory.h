// What one GPU holds during a training step under a plan: the persistent state (parameters,
// buffers, gradients, optimizer state), the forward values kept for the backward, and the
// peak of live bytes over the step's timeline as the per-rank program runs it (the forward
// pass's nodes in graph order, then the backward's; Node::runs_in). docs/cost_model.md 6.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoshard/lowering.h"
#include "autoshard/memory_model.h"

namespace autoshard {

struct StepMemory {
  int64_t parameters = 0;       // local shards of every parameter
  int64_t buffers = 0;          // local shards of every buffer
  int64_t inputs = 0;           // local shards of the step's inputs (held by the caller)
  int64_t gradients = 0;        // every parameter's gradient, in its parameter's layout
  int64_t optimizer_state = 0;  // OptimizerConfig's moments (and master weights) per local shard
  // Forward values the backward reads, computed ones only (parameters and
  // inputs are counted above); a view counts the storage it views, once.
  int64_t saved_activations = 0;
  // The most bytes live at once during the step: parameters, buffers and inputs throughout,
  // every value from the node that makes it to its last reader (views keep their storage
  // alive), gradients and outputs from where they are made to the end, and each collective's
  // output buffer while its consumer runs. The optimizer state is not part of it.
  int64_t step_peak = 0;
  std::string peak_at;  // the node running at the peak
  // What the GPU must hold at most: the step's peak plus the optimizer state, which lives
  // across steps.
  int64_t total_peak() const { return step_peak + optimizer_state; }
};

// `recompute` (one flag per graph node, or empty for none): forward nodes the backward runs
// again right before their first backward reader instead of keeping their outputs, and
// early nodes run in the backward only (trace/step_schedule.py with_recompute; recompute.h
// chooses them). Throws std::invalid_argument when `choice` does not have one entry per
// graph node, or `recompute` is neither empty nor that long.
StepMemory step_memory(const ShardingModel& sm, const std::vector<int32_t>& choice, const OptimizerConfig& optimizer,
                       const std::vector<char>& recompute = {});

// The pass a node runs in: its runs_in, else its phase; placeholders and nodes of a graph
// without phases run in the forward, tangents in the backward.
Phase pass_of(const Node& node);

}  // namespace autoshard
