// Which forward values the backward recomputes instead of keeping them, chosen per block
// (a numbered module such as "layers.3") once the layouts are planned, so that the step's
// peak memory per GPU (step_memory.h) fits the limit. docs/cost_model.md 6b.
//
// Each block takes one of four levels, each holding the one before it:
//   None       every value the backward reads is kept (the default where the plan fits);
//   Reshard    no gathered copy is kept: the block's early nodes (backward nodes that read
//              no gradient: a weight's transpose, a norm's saved statistics) run in the
//              backward, not the forward, its forward views of parameters are recomputed (a
//              gathered weight is gathered again instead of kept: FSDP's reshard after
//              forward, ZeRO-3), and so are the ops other than matmuls and attention that
//              read an activation the plan gathers, or their results, where the backward
//              reads them: the backward keeps the shard and gathers it again (context
//              parallelism's whole-sequence keys and values);
//   Selective  and every forward node but the matmuls and attention is recomputed (their
//              outputs are kept: the costly FLOPs run once; torchtitan's "op" policy);
//   Full       and every forward node is recomputed from the block's inputs (activation
//              checkpointing of the whole block).
// Ops that draw random numbers or write their inputs are never recomputed (their outputs
// are kept: a recomputed block sees the same random numbers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoshard/lowering.h"
#include "autoshard/memory_model.h"
#include "autoshard/overlap_model.h"
#include "autoshard/redistribute.h"
#include "autoshard/step_memory.h"

namespace autoshard {

enum class RecomputeLevel { None, Reshard, Selective, Full };
const char* recompute_level_name(RecomputeLevel level);

// How the planner picks the levels (options key "recompute").
enum class RecomputeMode {
  Auto,       // the cheapest levels that fit the memory limit; none where the plan fits
  Off,        // never: the report says when the plan does not fit
  Reshard,    // every block at Reshard (FSDP2's default reshard_after_forward)
  Selective,  // every block at Selective
  Full,       // every block at Full
};
// "auto" / "none" / "reshard" / "selective" / "full"; throws std::invalid_argument naming `what`.
RecomputeMode parse_recompute_mode(const std::string& name, const std::string& what);

struct BlockRecompute {
  std::string block;  // "layers.3"; empty for the nodes outside every block
  RecomputeLevel level = RecomputeLevel::None;
  // The block's name in plans and reports: the nodes outside every block are one more.
  std::string display_name() const { return block.empty() ? "(outside blocks)" : block; }
};

struct RecomputeDecision {
  std::vector<char> recompute;        // per graph node: run again in the backward (or early run late)
  std::vector<BlockRecompute> blocks;  // every block, in forward order, with its level
  double added_us = 0;                 // the recomputed nodes' compute and input redistributions
  int64_t limit_bytes = 0;             // the peak the levels were chosen to fit (0: none)
  bool fits = true;                    // memory.total_peak() <= limit_bytes
  StepMemory memory;                   // the step's memory with these levels
  // The names of the recomputed nodes (the plan's "recompute" list), in graph order.
  std::vector<std::string> node_names(const Graph& graph) const;
};

// The levels for `choice` under `mode`; `limit_bytes` <= 0 means no limit (Auto then
// recomputes nothing). Auto raises blocks one level at a time, cheapest level first and
// blocks in forward order, to the fewest that fit (the peak evaluated exactly for every
// candidate count); when even Full everywhere does not fit, it returns that with fits false.
RecomputeDecision choose_recompute(const ShardingModel& sm, const std::vector<int32_t>& choice,
                                   const OptimizerConfig& optimizer, RecomputeMode mode, int64_t limit_bytes,
                                   RedistributionCache& cache, const OverlapModel& overlap);

// The nodes each level recomputes in `block` (recompute.h's levels), as flags per graph node,
// under the layouts `choice` (one strategy per graph node: where the plan gathers; throws
// std::invalid_argument otherwise).
std::vector<char> recompute_flags(const ShardingModel& sm, const std::vector<int32_t>& choice,
                                  const std::vector<BlockRecompute>& blocks);

}  // namespace autoshard
