// Sequential tree-reweighted min-sum message passing (TRW-S, Kolmogorov 2006) on a GraphView
// with replaceable unary terms. It gives (1) a labeling decoded during each forward pass and
// (2) a lower bound valid for ANY messages: the energy is a sum of reparameterised unary and
// pairwise terms, and the sum of their minima bounds every labeling from below.
// Messages persist across calls, so changing the unaries (new memory multipliers) warm-starts.
#pragma once

#include <cstdint>
#include <vector>

#include "heuristic/graph_clusters.h"
#include "graph_view.h"

namespace autoshard::detail {

class Trws {
 public:
  // Sweeps visit the nodes in index order, or in reverse with `reversed`. The order decides
  // which neighbours a node's decode conditions on (the earlier ones, by their labels) and
  // the path the messages take, so searches in opposite orders decode different plans
  // (figures at portfolio_config in heuristic.cpp). The bound is valid in either order.
  explicit Trws(const GraphView& g, bool reversed = false);

  // Flattened like GraphView::node_cost.
  void set_unary(const std::vector<Cost>& unary) { unary_ = unary; }
  // With clusters, decoding gives every member of a group the label its first decoded member
  // implies (no dead ends on bijective edges).
  void set_clusters(const Clusters* clusters) { clusters_ = clusters; }
  const std::vector<Cost>& unary() const { return unary_; }

  // One forward + backward sweep. `labeling` (resized to num_nodes) receives the labeling
  // decoded in the forward sweep: each node takes its best label given the earlier nodes'
  // labels and the later nodes' messages.
  void iterate(std::vector<int32_t>& labeling);
  Cost lower_bound() const;
  // Decoding only (no message update) with other unaries, e.g. with extra memory penalties:
  // cheap, and it keeps neighbouring choices consistent because it conditions on them.
  void decode(const std::vector<Cost>& unary, std::vector<int32_t>& labeling);

  // Unary plus all incoming messages (the node's min-marginal estimate), for node i.
  void belief(int32_t i, std::vector<Cost>& out) const;

  // lower_bound() with the nodes marked in `keep` that have no later neighbour held out of
  // the sum: each such node's accumulated term goes to `terms` (flattened like the unaries)
  // and its id to `kept`, so that every labeling x has energy >= the returned value + the
  // sum over kept nodes i of terms[label_offset[i] + x_i]. The caller can minimise the kept
  // terms jointly under a constraint that couples them (lower_bound() minimises each alone).
  Cost lower_bound_keeping(const std::vector<uint8_t>& keep, std::vector<Cost>& terms,
                           std::vector<int32_t>& kept) const;

 private:
  const GraphView& g_;
  const bool reversed_;
  // The node at `place` in the forward sweep, and whether node a comes before node b in it.
  int32_t node_at(int32_t place) const { return reversed_ ? g_.num_nodes - 1 - place : place; }
  bool earlier(int32_t a, int32_t b) const { return reversed_ ? a > b : a < b; }
  std::vector<Cost> unary_;
  std::vector<int64_t> msg_offset_;  // per adjacency slot: message INTO the slot's node
  std::vector<Cost> msg_;
  std::vector<int64_t> reverse_slot_;
  std::vector<double> gamma_;
  std::vector<Cost> h_, tmp_, out_;
  const Clusters* clusters_ = nullptr;
  std::vector<int32_t> cluster_choice_;

  void start_decode();
  std::vector<Cost> score_;
  // Decodes node i from tmp_, or its whole group when it is the group's first node.
  int32_t pick(int32_t i, const Cost* unary, const std::vector<int32_t>& labeling);

  void send(int32_t i, int64_t slot);
};

}  // namespace autoshard::detail
