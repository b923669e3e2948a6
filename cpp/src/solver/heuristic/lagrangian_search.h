// One run of the anytime search on a reduced problem: Lagrangian multipliers on the memory
// limit (one per time point that matters), TRW-S message passing for the pairwise part,
// and every so often a polish of the decoded plan (repair to the limit, descent, tree LNS).
//
// The schedule is driven by counted work (PlanState::work units), never by the clock: the
// same graph and config give the same sequence of plans on any machine, and the clock only
// decides where the run stops. Several runs with different configs may share one GraphView
// and Clusters from different threads (both are read-only here).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "heuristic/graph_clusters.h"
#include "graph_view.h"
#include "heuristic/local_search.h"

namespace autoshard::detail {

struct SearchConfig {
  uint64_t seed = 0;
  // Share of the work spent polishing plans while the bound climbs (dual phase) and once the
  // multipliers only wander near the limit (primal phase).
  double polish_share_dual = 0.2;
  double polish_share_primal = 0.5;
  int32_t lns_tree_size = 48;
  bool verbose = false;
  bool integer_costs = false;  // every cost is an integer: a proof needs the gap below one unit
  int32_t id = 0;              // names the run in verbose output
  // Stop once best - bound <= gap_tolerance * |best + cost_offset| (0: only a proof stops it).
  double gap_tolerance = 0;
  // > 0: stop after this many rounds without a better plan or bound.
  int64_t stall_rounds = 0;
  // The multipliers' first step (scaled) and Polyak target gap above the bound: portfolio
  // runs that differ here follow other dual paths, so they decode other plans.
  double first_step_scale = 1.0;
  double first_target_gap = 0.15;
  // > 0: after this many rounds in a row whose decoded plan breaks the memory limit, the
  // multipliers where it breaks grow by up to 30 % a round on top of the subgradient step
  // (see Search::run); 0: never.
  int32_t push_after_over_rounds = 0;
  // Message passing sweeps the nodes in reverse index order (trws.h): another dual path.
  bool reverse_sweeps = false;
};

struct SearchStop {
  Clock::time_point deadline;
  // Set by a run that proved optimality (or reached the gap tolerance): the others stop at
  // their next round.
  std::atomic<bool>* proven = nullptr;
  int64_t work_limit = 0;  // > 0: stop once this much work is done (bit-identical runs)
};

struct SearchOutcome {
  std::vector<int32_t> best;  // empty when no valid plan was found
  Cost best_cost = 0;
  Cost lower_bound = 0;         // valid for the reduced problem
  double time_to_first_s = -1;  // since the run started
  int64_t work = 0;             // total counted work
  int64_t rounds = 0;
  // "time limit", "work limit", "proven optimal", "gap tolerance", "stalled" or "another run's proof"
  const char* stopped_by = "time limit";
};

// `cost_offset` is only added to verbose output (the reduced problem's dropped constant).
SearchOutcome lagrangian_search(const GraphView& g, const Clusters& clusters, int64_t usage_limit,
                                const SearchConfig& config, const SearchStop& stop, Cost cost_offset = 0);

}  // namespace autoshard::detail
