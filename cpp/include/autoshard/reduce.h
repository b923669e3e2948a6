// Exact, optimum-preserving reductions of a solver problem, with the map back.
//
// Every reduction keeps at least one optimal plan of the original problem reachable:
//  - infeasible strategies: an infinite node cost, no finite partner on some edge (to a
//    fixpoint, i.e. arc consistency), or a usage so large that the node's interval overflows
//    the memory limit even when every other live node takes its smallest usage, or a budget
//    usage that leaves no room in a global budget with every other node at its extreme;
//  - dominated strategies: another strategy of the same node is no worse in cost, in usage,
//    in every budget and in every entry of every incident edge row (ties keep the lower index);
//  - elimination of memory-free nodes (never live or zero usage, no budget usage) of degree
//    0, 1 or 2 by min-plus products into their neighbours (a degree-2 node becomes an edge).
// Nodes that carry memory are never folded: their usage would have to follow the choice made
// for the neighbour, which a per-time-point limit does not allow exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoshard/problem.h"

namespace autoshard {

struct ReduceOptions {
  bool remove_infeasible = true;
  bool remove_dominated = true;
  bool eliminate_memory_free = true;
  // A degree-2 elimination costs |S_u| x |S_v| x |S_w| operations; larger ones are skipped.
  int64_t max_chain_work = 4'000'000;
};

struct ReduceStats {
  int64_t strategies_before = 0, strategies_after = 0;
  int64_t infeasible_removed = 0, memory_removed = 0, dominated_removed = 0;
  int64_t budget_removed = 0;  // strategies no plan within the global budgets can take
  int64_t nodes_eliminated = 0;
  double seconds = 0;
};

struct Reduction {
  Problem reduced;          // solve this one
  bool infeasible = false;  // proven: no valid plan exists
  std::string infeasible_reason;
  Cost cost_offset = 0;                                 // cost(original plan) = cost(reduced plan) + cost_offset
  std::vector<int32_t> original_node;                   // reduced node -> original node
  std::vector<std::vector<int32_t>> original_strategy;  // reduced node -> its strategy -> original
  ReduceStats stats;

  // The original plan of a reduced plan (eliminated nodes take their recorded best choice).
  // Its cost is the reduced cost plus cost_offset, and it is valid when the reduced one is.
  Solution expand(const Solution& reduced_solution) const;

  // Internal record of one eliminated node, replayed backwards by expand().
  struct Elimination {
    int32_t node = 0;
    int32_t first = -1, second = -1;  // neighbours it was folded into (original ids), or -1
    int32_t second_size = 1;          // original strategy count of `second`
    std::vector<int32_t> choice;      // [s_first * second_size + s_second] -> original strategy
  };
  std::vector<Elimination> eliminations;  // in elimination order
  size_t original_num_nodes = 0;
};

Reduction reduce(const Problem& problem, const ReduceOptions& options = {});

}  // namespace autoshard
