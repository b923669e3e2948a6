// Exposed communication (docs/cost_model.md, section 5a): which redistributions the runtime
// hides behind compute, and how much of their time the planner should still charge.
//
// The lowered program (python/autoshard/overlap.py) issues every collective as soon as its
// input exists and waits for it only where the result is first used, with parameter gathers
// bucketed and prefetched one block ahead and gradient reductions bucketed per block. Two
// kinds of redistribution therefore run beside compute instead of in front of it:
//   - prefetchable: the source is a parameter or buffer, or computed from them alone (a view,
//     transpose or cast of a weight), so it exists before the step needs it;
//   - gradient reductions: the redistribution of a gradient into its parameter's layout, and
//     of values that only feed gradient outputs through data movement (views, splits,
//     clones), which nothing else in the backward waits for.
// Everything else (activations) sits on the critical path and is charged in full.
//
// How much is hidden depends on the compute it can run beside, which itself depends on the
// plan; the model stays linear (one factor per redistribution, constant over strategies) by
// estimating both sides from a reference: the compute of each pass at its cheapest strategies
// (ideally parallel compute), against the communication of a fully sharded plan of the same
// parameters (each gathered once per pass, each gradient reduced once). The hidden fraction
// of a pass is comm_overlap * min(1, compute / communication), and the first block's
// prefetch (or the last block's reduction) can never hide: with L blocks at least 1/L stays
// exposed. A pass with no such collectives keeps factor 1.
//
// The same two kinds are bucketed by the runtime (one collective call per block for its
// parameters' gathers, one per block for its gradients' reductions), so the fixed launch cost
// of a call is shared by the tensors of a bucket: such a redistribution, when it is one
// collective, is charged 1/k of its launch, k being the parameters per block. Without it, a plan that gathers every
// small norm weight on its own would look dearer than it runs, and the launch cost (gloo's is a few hundred
// microseconds) would push plans away from FSDP/DDP layouts they run well in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoshard/redistribute.h"

namespace autoshard {

struct ShardingModel;  // lowering.h, which holds the OverlapModel its costs were charged with

struct OverlapModel {
  // Per graph node, per tensor input (node.tensor_inputs() order): the factor the input's
  // redistribution time is charged at (1: on the critical path).
  std::vector<std::vector<double>> input_factor;
  // Per entry of graph.outputs: the factor for its redistribution (gradients into their
  // parameter's layout; forward outputs stay 1).
  std::vector<double> output_factor;
  // The factor of each pass's overlappable collectives, and what it was derived from (for
  // the plan report).
  double forward_factor = 1, backward_factor = 1;
  double forward_compute_us = 0, backward_compute_us = 0;
  double forward_comm_us = 0, backward_comm_us = 0;  // the fully sharded reference
  int blocks = 1;                                    // repeated blocks (numbered modules such as layers.3) + the rest
  // Per graph node, per tensor input, and per entry of graph.outputs: the share of the
  // redistribution's collective launch costs charged (1: each call pays its own; 1/k for
  // what the runtime buckets, k = parameters per block).
  std::vector<std::vector<double>> input_launch_share;
  std::vector<double> output_launch_share;
  double launch_us = 0;  // the hardware's fixed cost per collective call
};

// The time charged for a redistribution taking `us` with `collectives` collective calls:
// a single call pays `launch_share` of its launch (a chain of calls over several mesh dims
// pays every launch), and `exposed` of the rest is charged.
// An infeasible redistribution (us >= kInfeasibleCost) stays as it is.
double charged_time_us(double us, int collectives, double launch_us, double launch_share, double exposed);

// All factors are 1 when the hardware's comm_overlap is 0; launch shares do not depend on it.
OverlapModel model_overlap(const ShardingModel& sm, RedistributionCache& cache);

// The block a parameter belongs to, as the runtime buckets its gathers and reductions
// (python/autoshard/blocks.py): its name up to the first numeric module ("layers.3" for
// "layers.3.attention.wq.weight"); "" outside any block (a parameter named "0" is not one).
std::string parameter_block(const std::string& fqn);

// The number of prefetch/reduction groups among parameter names: one per distinct
// parameter_block, plus one for parameters outside any block.
int count_blocks(const std::vector<std::string>& parameter_fqns);

}  // namespace autoshard
