// A compact, read-only view of a solver problem for the search: flattened per-node arrays,
// parallel edges merged into one matrix per node pair, and CSR adjacency. Built once (the
// 100 MB IOPDDL instances take well under a second) so the inner loops touch contiguous memory.
// It is the one normalisation of a problem every solver method reads (heuristic, exact
// search, greedy warm start, budget branch and bound).
#pragma once

#include <cstdint>
#include <vector>

#include "autoshard/problem.h"

namespace autoshard::detail {

struct GraphView {
  // Move-only: edge matrices are found through pointers, some into this view's own storage.
  GraphView() = default;
  GraphView(GraphView&&) = default;
  GraphView& operator=(GraphView&&) = default;
  GraphView(const GraphView&) = delete;
  GraphView& operator=(const GraphView&) = delete;

  int32_t num_nodes = 0;
  // Per node: labels are strategies 0..num_labels[i]-1, data at label_offset[i] + s.
  std::vector<int32_t> num_labels;
  std::vector<int64_t> label_offset;  // num_nodes + 1
  std::vector<Cost> node_cost;        // flattened
  std::vector<int64_t> usage;         // flattened (0 when the node is never live)
  std::vector<Interval> interval;
  int64_t usage_limit = -1;  // the problem's memory limit; < 0: none
  // Global budgets: usage flattened like node_cost (0 for empty rows), low <= sum <= high.
  struct Budget {
    std::vector<int64_t> usage;
    int64_t low = 0, high = 0;
  };
  std::vector<Budget> budgets;

  // Merged undirected edges: a < b, matrix |S_a| x |S_b| row-major at matrix_at[e]: in
  // `matrix` (at matrix_offset[e]), or in storage shared with the view it was built from.
  // Edges with equal matrices (same shape and entries) all point at the first one's.
  std::vector<int32_t> edge_a, edge_b;
  std::vector<int64_t> matrix_offset;
  std::vector<Cost> matrix;
  std::vector<const Cost*> matrix_at;

  // CSR adjacency: for node i, entries adj_offset[i] .. adj_offset[i+1]-1.
  std::vector<int64_t> adj_offset;
  std::vector<int32_t> adj_edge;   // merged edge index
  std::vector<int32_t> adj_other;  // the neighbour

  int32_t labels(int32_t i) const { return num_labels[i]; }
  const Cost* costs(int32_t i) const { return node_cost.data() + label_offset[i]; }
  const int64_t* usages(int32_t i) const { return usage.data() + label_offset[i]; }
  const Cost* edge_matrix(int32_t e) const { return matrix_at[e]; }
  // Cost of edge e with node i at label si and the other end at label so.
  Cost edge_cost(int32_t e, int32_t i, int32_t si, int32_t so) const {
    const Cost* m = edge_matrix(e);
    return edge_a[e] == i ? m[static_cast<int64_t>(si) * num_labels[edge_b[e]] + so]
                          : m[static_cast<int64_t>(so) * num_labels[edge_b[e]] + si];
  }
  int64_t num_edges() const { return static_cast<int64_t>(edge_a.size()); }
};

// Self-loop edges (u == v) are folded into the node cost (only the diagonal can be chosen).
// Infeasible entries are stored as kInfeasibleCost, and so is every sum with one among its
// terms (a negative parallel term must not make a forbidden pair allowed).
// `shared` (optional, one entry per problem edge): a non-null entry is that edge's matrix,
// already clamped, stored elsewhere and outliving the view (its `costs` are then ignored);
// an edge u < v merged with no other is referenced there instead of copied.
GraphView build_graph_view(const Problem& problem, const std::vector<const Cost*>* shared = nullptr);

// Whether a matrix is already in the view's (and the reductions') stored form: no NaN, no
// entry above kInfeasibleCost, no -0 (both store 0.0 + c, clamped to kInfeasibleCost).
bool already_clamped(const std::vector<Cost>& costs);

// Per problem edge: its own costs where a view may reference them as they are (`shared` above),
// else null: a u < v edge of the right size whose entries are already what the view stores
// (finite and not -0, or exactly kInfeasibleCost). Reading a matrix is far cheaper than copying
// it (fresh pages to fault in), and the view then holds no second copy of the problem's
// matrices; the problem must outlive the view.
std::vector<const Cost*> referable_matrices(const Problem& problem);

// build_graph_view referencing the referable matrices of `problem`, which must outlive the view.
GraphView build_referencing_view(const Problem& problem);

// Objective of a full assignment (sum of node costs and edge entries); exact for valid plans.
Cost graph_cost(const GraphView& g, const std::vector<int32_t>& x);

// Time compressed to the points where the live usage can peak: it is piecewise constant and
// only rises where an interval starts, so the distinct starts of the nodes live with some
// usage are the only time points a memory check needs.
struct LivePoints {
  std::vector<int64_t> times;        // sorted distinct starts
  std::vector<int32_t> first, last;  // node i is live at points [first[i], last[i]); empty when
                                     // it is never live or never uses memory
  int32_t size() const { return static_cast<int32_t>(times.size()); }
};
LivePoints live_points(const GraphView& g);

// Whether budget k can bind: the least and the most usage any plan reaches are not both
// within [low, high].
bool budget_can_bind(const GraphView& g, size_t k);

}  // namespace autoshard::detail
