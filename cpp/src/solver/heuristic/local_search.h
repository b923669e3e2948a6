// A plan under construction with its exact cost, live-usage profile and budget sums kept up to
// date under single-node moves, plus the two moves the heuristic needs: repair (make the plan
// respect memory and budgets, giving up as little cost as possible) and descent (single-node
// improving moves that never break a limit).
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "autoshard/clock.h"
#include "heuristic/graph_clusters.h"
#include "graph_view.h"
#include "heuristic/memory_profile.h"

namespace autoshard::detail {

using autoshard::Clock;  // clock.h
using autoshard::seconds_since;

class PlanState {
 public:
  PlanState(const GraphView& g, MemoryProfile& memory);

  void reset(const std::vector<int32_t>& x);
  const std::vector<int32_t>& labels() const { return x_; }
  Cost cost() const { return cost_; }
  bool memory_ok() const { return !memory_.limited() || memory_.peak() <= memory_.limit(); }
  bool budgets_ok() const;
  int64_t budget_sum(size_t k) const { return budget_sum_[k]; }
  bool takes_infeasible() const { return is_infeasible(cost_); }
  bool valid() const { return memory_ok() && budgets_ok() && !takes_infeasible(); }

  // Cost of every label of node i with the neighbours fixed (node cost + incident edges).
  void local_costs(int32_t i, std::vector<Cost>& out) const;
  // Whether node i may take label s without breaking memory or a budget bound.
  bool move_fits(int32_t i, int32_t s) const;
  void move(int32_t i, int32_t s, Cost delta);
  // After undoing trial moves: restore the exact running cost they started from.
  void set_cost(Cost cost) { cost_ = cost; }
  // Recomputes the running cost exactly (moves through infeasible entries lose precision).
  void recompute_cost() { cost_ = graph_cost(g_, x_); }

  // Greedy repair: while some limit is broken, take the usage-reducing (or budget-fixing)
  // single-node move with the smallest cost increase per unit of excess removed.
  bool repair(Clock::time_point deadline);
  // Best-improvement single-node descent over a work queue, seeded with `seeds` (all nodes
  // when empty). Returns the number of moves made.
  int64_t descend(Clock::time_point deadline, const std::vector<int32_t>& seeds = {});

  // Sweeps over groups of bijectively tied nodes, moving each group as a whole to its best
  // label when that improves the cost and keeps every limit. Requires a valid plan.
  int64_t descend_clusters(Clock::time_point deadline, const Clusters& clusters);
  // Cost change of node i switching to label s with the neighbours as they are.
  Cost move_delta(int32_t i, int32_t s) const;

  // Improving moves that need memory: take the move, then let a short greedy repair (that
  // may not undo it) make room; keep the result only when the total cost went down.
  int64_t descend_ejection(Clock::time_point deadline, const Clusters& clusters);
  // The three descents above in turn, in that order, until a pass moves nothing (at most 10
  // passes). Returns the number of moves made.
  int64_t descend_all(Clock::time_point deadline, const Clusters& clusters);

  const GraphView& graph() const { return g_; }
  MemoryProfile& memory() { return memory_; }

  // Deterministic measure of the work done so far (roughly: edge-matrix entries read plus
  // memory-profile updates). The heuristic schedules its phases on it instead of the clock,
  // so the same problem and options give the same sequence of plans on any machine.
  int64_t work() const { return work_; }
  void add_work(int64_t w) const { work_ += w; }

 private:
  const GraphView& g_;
  MemoryProfile& memory_;
  std::vector<int32_t> x_;
  Cost cost_ = 0;
  std::vector<int64_t> budget_sum_;
  mutable std::vector<Cost> scratch_;
  mutable int64_t work_ = 0;
  int64_t memory_op_work_ = 1;  // one profile update or query: a walk down the segment tree

  using MoveLog = std::vector<std::pair<int32_t, int32_t>>;  // (node, previous label)
  std::vector<uint8_t> locked_;                              // nodes the memory repair may not move
  std::vector<Cost> repair_scratch_;
  MoveLog group_log_;

  bool repair_budgets(Clock::time_point deadline);
  // Greedy memory repair of at most max_steps moves, skipping locked nodes, logging moves.
  bool repair_memory(Clock::time_point deadline, int64_t max_steps, MoveLog* log);
  void undo(MoveLog& log, Cost cost_before);
};

}  // namespace autoshard::detail
