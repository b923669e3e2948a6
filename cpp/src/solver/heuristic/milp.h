// The problem as a mixed-integer program over its clusters (graph_clusters.h), solved by
// HiGHS. It closes what the branch and bound leaves open on small dense problems (~1,000 nodes
// with 20-30 strategies each: the exact search's bound keeps a gap of a few percent there,
// where the MILP's LP relaxation with the edge marginals is nearly tight and HiGHS proves the
// optimum in seconds), and, contracted to clusters, it solves the XLA graphs whose tens of
// thousands of nodes are tied into a few hundred clusters (public A, C, P): there the
// node-level dual bound of the search stays percents below the optimum.
//
// Model (the local-marginal polytope of the contracted problem; singleton clusters give the
// per-node one):
//   x[k,s] binary per cluster label with a finite cost (the members' node costs and the edges
//   inside the cluster at the labels s fixes), sum_s x[k,s] = 1;
//   per cluster pair joined by edges (their matrices summed) that is not a row term plus a
//   column term, y[kl,a,b] in [0,1] per finite entry, with sum_b y[kl,a,b] = x[k,a] and
//   sum_a y[kl,a,b] = x[l,b] (so y is the chosen pair when x is integral, and a missing pair
//   is forbidden); additive matrices go to the cluster costs;
//   memory: one row per time where the live set is maximal, usages above each node's least
//   (added lazily where the MILP's plan breaks them when there are many);
//   global budgets: one row each.
#pragma once

#include <atomic>
#include <cstdint>

#include "autoshard/problem.h"
#include "autoshard/solver.h"
#include "graph_view.h"
#include "heuristic/graph_clusters.h"

namespace autoshard::detail {

// The size of the MILP over `clusters`: how many columns it has (labels with a finite cost,
// plus the finite entries of the cluster-pair matrices that are not folded into cluster
// costs) and nonzeros, columns -1 when the model is past its caps (too many clusters or
// columns: the LP relaxation alone would take minutes); and whether its memory rows are added
// lazily (solve_milp), so that it solves several relaxations. Linear in the edge matrices and
// the memory rows.
struct MilpSize {
  int64_t columns = -1;
  int64_t nonzeros = 0;  // of the model HiGHS first gets (lazy memory rows left out)
  bool lazy_memory = false;
};
MilpSize milp_size(const GraphView& g, const Clusters& clusters, int64_t usage_limit,
                   int64_t eager_memory_nonzeros = 1'000'000);

// Memory rows go into the model at once while they have at most `eager_memory_nonzeros`
// nonzeros; beyond, only the rows that solutions break are added, round by round: first the
// LP relaxation's, re-solved until it breaks none, then the MILP's (each round's bound is
// valid; the MILP rounds that may still add rows stop at a 1 % gap, the last one is solved to
// o.gap_tolerance). Each relaxation's plan is made to fit every row by the search's repair
// and descents, and the best so far starts the next MILP round; a MILP round starts only
// while the time the LP rounds took is left.
SolveResult solve_milp(const GraphView& g, const Clusters& clusters, int64_t usage_limit, bool integer_costs,
                       const SolveOptions& o, const Solution* incumbent, const std::atomic<bool>* interrupt = nullptr,
                       int64_t eager_memory_nonzeros = 1'000'000);

}  // namespace autoshard::detail
