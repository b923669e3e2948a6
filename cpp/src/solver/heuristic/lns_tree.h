// Large-neighbourhood search with exact dynamic programming on trees. Groups of bijectively
// tied nodes become single "super nodes" (their members follow the group label), giving a
// smaller graph. Each step grows an induced tree of super nodes around a seed, fixes
// everything else, and solves the tree exactly (min-sum DP) on cost plus memory prices
// (the Lagrange multipliers); the result is kept only if the true plan is valid and cheaper.
#pragma once

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "heuristic/graph_clusters.h"
#include "graph_view.h"
#include "heuristic/local_search.h"

namespace autoshard::detail {

class TreeLns {
 public:
  TreeLns(const GraphView& g, const Clusters& clusters);

  // Memory price of every original label (flattened like GraphView::node_cost).
  void set_prices(const std::vector<Cost>& price_per_label);
  // Greedy memory repair with whole-group moves: while the limit breaks, take the group move
  // with the smallest cost increase per unit of usage removed at the peak. Then budgets.
  bool repair(PlanState& state, Clock::time_point deadline);
  // Runs steps until the deadline or max_steps; returns the number of improving steps.
  // Stops early once the steps have added max_work to state.work().
  int64_t run(PlanState& state, Clock::time_point deadline, int64_t max_steps, int32_t tree_size, std::mt19937_64& rng,
              int64_t max_work = std::numeric_limits<int64_t>::max());
  // The group graph: one node per group, labelled by its root's label (PairKick moves on it).
  const GraphView& groups() const { return super_; }

 private:
  const GraphView& g_;
  const Clusters& cl_;
  GraphView super_;                // one node per group, label = group (root) label
  std::vector<Cost> super_price_;  // flattened like super_.node_cost
  std::vector<Cost> local_;
  std::vector<int64_t> du_;
  // scratch
  std::vector<int32_t> order_, parent_, parent_slot_, in_tree_, label_;
  std::vector<int64_t> table_offset_;
  std::vector<Cost> best_, child_best_;
};

}  // namespace autoshard::detail
