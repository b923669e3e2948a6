// Compound moves for a plan that single-node, group, ejection and tree moves cannot improve:
// two adjacent groups (graph_clusters.h) take new labels together, the groups around them
// settle by group descent (infeasible entries left by the kick included), and the result is
// kept only when it is valid and cheaper.
//
// Why pairs: on C-mem0.97 the 8.92e10 plan and the 8.64e10 one differ in three groups that are
// pairwise adjacent (a triangle, so no induced tree of the tree LNS holds them together), and
// none of the three improves the plan alone, even with its neighbours settling after it. Kicking
// two of them, then letting the rest settle, reaches 8.64e10.
//
// Which pairs: per group edge, the label pairs with the largest optimistic gain (the pair's
// cost now against its cost with every other neighbour at its cheapest label for the pair),
// skipping labels whose extra memory a member could not fit on its own.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "heuristic/graph_clusters.h"
#include "graph_view.h"
#include "heuristic/local_search.h"

namespace autoshard::detail {

class PairKick {
 public:
  // `groups` is the group graph of `clusters` over `g` (TreeLns::groups()); both must outlive this.
  PairKick(const GraphView& g, const Clusters& clusters, const GraphView& groups);

  // Tries up to max_trials kicks, most promising first (the estimate below), until the
  // deadline or max_work more work; returns the number kept. Requires a valid plan.
  int64_t run(PlanState& state, Clock::time_point deadline, int32_t max_trials,
              int64_t max_work = std::numeric_limits<int64_t>::max());

  // Group moves the settling descent may make per kick.
  static constexpr int32_t kSettleMoves = 1000;
  // Label pairs tried per group edge, best estimates first. The estimate ranks poorly: on
  // C-mem0.97 the kicks that took 9.03e10 to 8.59e10 ranked 149th to 1110th of ~1,170, and with
  // one pair per edge the same plan only reached 9.02e10 (8.69e10 with the best 256 of three).
  static constexpr int32_t kPairsPerEdge = 3;

 private:
  const GraphView& g_;
  const Clusters& cl_;
  const GraphView& gr_;
  // Optimistic cost of group c at label r: its own cost plus, per incident edge, the row
  // minimum (the neighbour at its cheapest label for r). Fixed by the problem; a pair's
  // estimate swaps the row minima of the edge between them for the actual entry.
  std::vector<Cost> opt_;     // flattened like gr_.node_cost
  std::vector<Cost> rowmin_;  // per adjacency slot k of gr_: labels of adj's owner, at slot_offset_[k]
  std::vector<int64_t> slot_offset_;
  std::vector<int64_t> slot_a_, slot_b_;  // per group edge: its slot at edge_a and at edge_b
  int64_t walk_work_ = 1;                  // work of one walk down the memory profile's tree
  struct Candidate {
    Cost gain;  // estimated
    int32_t e, r, q;
  };
  // scratch
  std::vector<Candidate> edge_cand_;
  std::vector<int32_t> y_;  // group labels of the plan being changed
  std::vector<Cost> local_, local_cost_;
  std::vector<uint8_t> locked_, queued_, fits_;
  std::vector<int32_t> queue_;
  std::vector<std::pair<int32_t, int32_t>> log_;  // (node, previous label)

  int32_t group_label(const PlanState& s, int32_t c) const;
  // Moves group c to label r; `delta` is the cost change (from group_costs).
  void group_move(PlanState& s, int32_t c, int32_t r, Cost delta);
  // Group c's cost at every label with the other groups as they are (y_).
  void group_costs(PlanState& s, int32_t c, std::vector<Cost>& out) const;
  bool trial(PlanState& s, int32_t c, int32_t r, int32_t d, int32_t q, Clock::time_point deadline);
};

}  // namespace autoshard::detail
