#include "heuristic/local_search.h"

#include <algorithm>
#include <deque>
#include <limits>

namespace autoshard::detail {

PlanState::PlanState(const GraphView& g, MemoryProfile& memory) : g_(g), memory_(memory) {
  while ((int64_t(1) << memory_op_work_) < int64_t(memory.num_points()) + 1) ++memory_op_work_;
}

void PlanState::reset(const std::vector<int32_t>& x) {
  x_ = x;
  work_ += g_.num_nodes + int64_t(g_.adj_other.size());
  cost_ = graph_cost(g_, x_);
  memory_.reset(x_);
  budget_sum_.assign(g_.budgets.size(), 0);
  for (size_t k = 0; k < g_.budgets.size(); ++k)
    for (int32_t i = 0; i < g_.num_nodes; ++i) budget_sum_[k] += g_.budgets[k].usage[g_.label_offset[i] + x_[i]];
}

bool PlanState::budgets_ok() const {
  for (size_t k = 0; k < g_.budgets.size(); ++k)
    if (budget_sum_[k] < g_.budgets[k].low || budget_sum_[k] > g_.budgets[k].high) return false;
  return true;
}

void PlanState::local_costs(int32_t i, std::vector<Cost>& out) const {
  const int32_t S = g_.labels(i);
  work_ += int64_t(S) * (1 + g_.adj_offset[i + 1] - g_.adj_offset[i]);
  out.assign(g_.costs(i), g_.costs(i) + S);
  for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
    const int32_t e = g_.adj_edge[k], j = g_.adj_other[k];
    const Cost* m = g_.edge_matrix(e);
    if (g_.edge_a[e] == i) {
      const int32_t Sj = g_.labels(j);
      for (int32_t s = 0; s < S; ++s) out[s] += m[int64_t(s) * Sj + x_[j]];
    } else {
      const Cost* row = m + int64_t(x_[j]) * S;
      for (int32_t s = 0; s < S; ++s) out[s] += row[s];
    }
  }
}

bool PlanState::move_fits(int32_t i, int32_t s) const {
  work_ += memory_op_work_;
  if (!memory_.fits(i, x_[i], s)) return false;
  for (size_t k = 0; k < g_.budgets.size(); ++k) {
    const auto& u = g_.budgets[k].usage;
    const int64_t next = budget_sum_[k] - u[g_.label_offset[i] + x_[i]] + u[g_.label_offset[i] + s];
    // A move may not leave the range, nor move further away from it.
    const int64_t lo = g_.budgets[k].low, hi = g_.budgets[k].high;
    if (next > hi && next > budget_sum_[k]) return false;
    if (next < lo && next < budget_sum_[k]) return false;
  }
  return true;
}

void PlanState::move(int32_t i, int32_t s, Cost delta) {
  if (s == x_[i]) return;
  work_ += 2 * memory_op_work_;
  memory_.move(i, x_[i], s);
  for (size_t k = 0; k < g_.budgets.size(); ++k) {
    const auto& u = g_.budgets[k].usage;
    budget_sum_[k] += u[g_.label_offset[i] + s] - u[g_.label_offset[i] + x_[i]];
  }
  cost_ += delta;
  x_[i] = s;
}

bool PlanState::repair(Clock::time_point deadline) {
  if (!repair_memory(deadline, std::numeric_limits<int64_t>::max(), nullptr)) return false;
  return repair_budgets(deadline);
}

bool PlanState::repair_memory(Clock::time_point deadline, int64_t max_steps, MoveLog* log) {
  const int64_t limit = memory_.limit();
  std::vector<Cost>& lc = repair_scratch_;
  locked_.resize(g_.num_nodes, 0);
  for (int64_t step = 0; memory_.limited() && memory_.peak() > limit; ++step) {
    if (step >= max_steps || Clock::now() > deadline) return false;
    const int32_t t = memory_.peak_point();
    const int64_t excess = memory_.peak() - limit;
    work_ += g_.num_nodes;
    double best_ratio = std::numeric_limits<double>::infinity();
    int32_t best_node = -1, best_label = -1;
    Cost best_delta = 0;
    for (int32_t i = 0; i < g_.num_nodes; ++i) {
      if (memory_.first(i) > t || memory_.last(i) <= t || locked_[i]) continue;
      const int64_t* u = g_.usages(i);
      bool any = false;
      for (int32_t s = 0; s < g_.labels(i) && !any; ++s) any = u[s] < u[x_[i]];
      if (!any) continue;
      local_costs(i, lc);
      for (int32_t s = 0; s < g_.labels(i); ++s) {
        if (u[s] >= u[x_[i]] || is_infeasible(lc[s])) continue;
        const double gain = double(std::min(u[x_[i]] - u[s], excess));
        const double ratio = (lc[s] - lc[x_[i]]) / gain;
        if (ratio < best_ratio) {
          best_ratio = ratio;
          best_node = i;
          best_label = s;
          best_delta = lc[s] - lc[x_[i]];
        }
      }
    }
    if (best_node < 0) return false;  // nothing live at the peak can shrink
    if (log) log->push_back({best_node, x_[best_node]});
    move(best_node, best_label, best_delta);
  }
  return true;
}

void PlanState::undo(MoveLog& log, Cost cost_before) {
  for (auto it = log.rbegin(); it != log.rend(); ++it) move(it->first, it->second, 0.0);
  log.clear();
  cost_ = cost_before;
}

int64_t PlanState::descend_ejection(Clock::time_point deadline, const Clusters& cl) {
  // A cheaper label that does not fit in memory is taken anyway, then the greedy repair
  // (which may not touch the moved node) makes room; kept only when the total improves.
  int64_t moves = 0;
  std::vector<Cost> lc;
  MoveLog log;
  locked_.resize(g_.num_nodes, 0);
  for (int32_t i = 0; i < g_.num_nodes; ++i) {
    if ((i & 255) == 0 && Clock::now() > deadline) break;
    if (cl.size(cl.cluster_of[i]) > 1 || !memory_.limited()) continue;
    local_costs(i, lc);
    const Cost current = lc[x_[i]];
    const Cost tol = 1e-9 * std::max(1.0, std::abs(cost_));
    int32_t best = -1;
    for (int32_t s = 0; s < g_.labels(i); ++s)
      if (lc[s] < current - tol && (best < 0 || lc[s] < lc[best]) && !memory_.fits(i, x_[i], s)) best = s;
    if (best < 0) continue;
    // Only worth trying when even the best single-move ratio could pay for the room.
    const Cost before = cost_;
    log.clear();
    log.push_back({i, x_[i]});
    move(i, best, lc[best] - current);
    locked_[i] = 1;
    const bool ok = repair_memory(deadline, 12, &log) && budgets_ok();
    locked_[i] = 0;
    if (ok && cost_ < before - tol) {
      ++moves;
    } else {
      undo(log, before);
    }
  }
  return moves;
}

bool PlanState::repair_budgets(Clock::time_point deadline) {
  std::vector<Cost> lc;
  for (size_t k = 0; k < g_.budgets.size(); ++k) {
    const auto& b = g_.budgets[k];
    while (budget_sum_[k] < b.low || budget_sum_[k] > b.high) {
      if (Clock::now() > deadline) return false;
      const bool too_high = budget_sum_[k] > b.high;
      const int64_t excess = too_high ? budget_sum_[k] - b.high : b.low - budget_sum_[k];
      double best_ratio = std::numeric_limits<double>::infinity();
      int32_t best_node = -1, best_label = -1;
      Cost best_delta = 0;
      for (int32_t i = 0; i < g_.num_nodes; ++i) {
        const int64_t* u = b.usage.data() + g_.label_offset[i];
        bool any = false;
        for (int32_t s = 0; s < g_.labels(i) && !any; ++s) any = too_high ? u[s] < u[x_[i]] : u[s] > u[x_[i]];
        if (!any) continue;
        local_costs(i, lc);
        for (int32_t s = 0; s < g_.labels(i); ++s) {
          const int64_t change = too_high ? u[x_[i]] - u[s] : u[s] - u[x_[i]];
          if (change <= 0 || is_infeasible(lc[s]) || !memory_.fits(i, x_[i], s)) continue;
          // Other budgets must not be pushed out of range.
          bool others_ok = true;
          for (size_t q = 0; q < g_.budgets.size() && others_ok; ++q) {
            if (q == k) continue;
            const auto& uq = g_.budgets[q].usage;
            const int64_t next = budget_sum_[q] - uq[g_.label_offset[i] + x_[i]] + uq[g_.label_offset[i] + s];
            others_ok = next >= g_.budgets[q].low && next <= g_.budgets[q].high;
          }
          if (!others_ok) continue;
          const double ratio = (lc[s] - lc[x_[i]]) / double(std::min(change, excess));
          if (ratio < best_ratio) {
            best_ratio = ratio;
            best_node = i;
            best_label = s;
            best_delta = lc[s] - lc[x_[i]];
          }
        }
      }
      if (best_node < 0) return false;
      move(best_node, best_label, best_delta);
    }
  }
  return true;
}

int64_t PlanState::descend(Clock::time_point deadline, const std::vector<int32_t>& seeds) {
  std::deque<int32_t> queue;
  std::vector<uint8_t> queued(g_.num_nodes, 0);
  if (seeds.empty()) {
    for (int32_t i = 0; i < g_.num_nodes; ++i) queue.push_back(i);
    std::fill(queued.begin(), queued.end(), 1);
  } else {
    for (int32_t i : seeds)
      if (!queued[i]) {
        queued[i] = 1;
        queue.push_back(i);
      }
  }
  int64_t moves = 0, steps = 0;
  std::vector<Cost> lc;
  while (!queue.empty()) {
    if ((++steps & 1023) == 0 && Clock::now() > deadline) break;
    const int32_t i = queue.front();
    queue.pop_front();
    queued[i] = 0;
    local_costs(i, lc);
    const Cost current = lc[x_[i]];
    int32_t best = x_[i];
    for (int32_t s = 0; s < g_.labels(i); ++s)
      if (lc[s] < lc[best] && move_fits(i, s)) best = s;
    // Relative tolerance: ignore changes lost in floating-point noise.
    if (best != x_[i] && lc[best] < current - 1e-9 * std::max(1.0, std::abs(current))) {
      move(i, best, lc[best] - current);
      ++moves;
      for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
        const int32_t j = g_.adj_other[k];
        if (!queued[j]) {
          queued[j] = 1;
          queue.push_back(j);
        }
      }
    }
  }
  return moves;
}

Cost PlanState::move_delta(int32_t i, int32_t s) const {
  const int32_t cur = x_[i];
  if (s == cur) return 0;
  work_ += 1 + g_.adj_offset[i + 1] - g_.adj_offset[i];
  Cost delta = g_.costs(i)[s] - g_.costs(i)[cur];
  for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
    const int32_t e = g_.adj_edge[k], j = g_.adj_other[k];
    delta += g_.edge_cost(e, i, s, x_[j]) - g_.edge_cost(e, i, cur, x_[j]);
  }
  return delta;
}

int64_t PlanState::descend_clusters(Clock::time_point deadline, const Clusters& cl) {
  int64_t moves = 0;
  std::vector<int32_t> saved, order;
  std::vector<Cost> delta;
  locked_.resize(g_.num_nodes, 0);
  std::deque<int32_t> queue;
  std::vector<uint8_t> queued(cl.num_clusters(), 0);
  for (int32_t c = 0; c < cl.num_clusters(); ++c)
    if (cl.size(c) > 1) {
      queue.push_back(c);
      queued[c] = 1;
    }
  while (!queue.empty()) {
    const int32_t c = queue.front();
    queue.pop_front();
    queued[c] = 0;
    if (Clock::now() > deadline) return moves;
    const int32_t size = cl.size(c);
    const int32_t* mem = cl.members.data() + cl.member_offset[c];
    saved.assign(size, 0);
    for (int32_t k = 0; k < size; ++k) saved[k] = x_[mem[k]];
    const int32_t root = mem[0], S = g_.labels(root);
    // Cost change of every group label, without moving anything: member costs, edges to
    // outside nodes, and edges inside the group (counted once, from their `a` end).
    delta.assign(S, 0.0);
    for (int32_t k = 0; k < size; ++k) {
      const int32_t m = mem[k];
      const int32_t* lab = cl.label_of_root.data() + cl.map_offset[m];
      const Cost* cm = g_.costs(m);
      for (int32_t r = 0; r < S; ++r) delta[r] += cm[lab[r]] - cm[x_[m]];
      for (int64_t a = g_.adj_offset[m]; a < g_.adj_offset[m + 1]; ++a) {
        const int32_t j = g_.adj_other[a], e = g_.adj_edge[a];
        if (cl.cluster_of[j] == c) {
          if (g_.edge_a[e] != m) continue;
          const int32_t* labj = cl.label_of_root.data() + cl.map_offset[j];
          const Cost now = g_.edge_cost(e, m, x_[m], x_[j]);
          for (int32_t r = 0; r < S; ++r) delta[r] += g_.edge_cost(e, m, lab[r], labj[r]) - now;
        } else {
          const Cost now = g_.edge_cost(e, m, x_[m], x_[j]);
          for (int32_t r = 0; r < S; ++r) delta[r] += g_.edge_cost(e, m, lab[r], x_[j]) - now;
        }
      }
    }
    order.resize(S);
    for (int32_t r = 0; r < S; ++r) order[r] = r;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return delta[a] < delta[b]; });
    const Cost tol = 1e-9 * std::max(1.0, std::abs(cost_));
    int32_t best_r = -1;
    const Cost cost_before = cost_;
    for (int32_t r : order) {
      if (!(delta[r] < -tol)) break;
      for (int32_t k = 0; k < size; ++k) {
        const int32_t m = mem[k];
        const int32_t s = cl.label_of_root[cl.map_offset[m] + r];
        if (s != x_[m]) move(m, s, move_delta(m, s));
      }
      if (valid()) {
        best_r = r;
        break;
      }
      if (memory_.limited() && budgets_ok() && !takes_infeasible()) {
        // Make room for the group with the greedy repair (group members locked).
        for (int32_t k = 0; k < size; ++k) locked_[mem[k]] = 1;
        group_log_.clear();
        const Cost cost_after_group = cost_;
        const bool ok = repair_memory(deadline, 12, &group_log_) && budgets_ok();
        for (int32_t k = 0; k < size; ++k) locked_[mem[k]] = 0;
        if (ok && cost_ < cost_before - tol) {
          best_r = r;
          break;
        }
        undo(group_log_, cost_after_group);
      }
      for (int32_t k = size - 1; k >= 0; --k) {
        const int32_t m = mem[k];
        if (x_[m] != saved[k]) move(m, saved[k], move_delta(m, saved[k]));
      }
      cost_ = cost_before;  // trial moves pass through infeasible entries: no rounding drift
    }
    if (best_r < 0) continue;
    recompute_cost();
    ++moves;
    for (int32_t k = 0; k < size; ++k)
      for (int64_t a = g_.adj_offset[mem[k]]; a < g_.adj_offset[mem[k] + 1]; ++a) {
        const int32_t d = cl.cluster_of[g_.adj_other[a]];
        if (!queued[d] && cl.size(d) > 1 && d != c) {
          queued[d] = 1;
          queue.push_back(d);
        }
      }
  }
  return moves;
}

int64_t PlanState::descend_all(Clock::time_point deadline, const Clusters& clusters) {
  int64_t total = 0;
  for (int pass = 0; pass < 10 && Clock::now() < deadline; ++pass) {
    const int64_t single = descend(deadline);
    const int64_t grouped = descend_clusters(deadline, clusters);
    const int64_t ejected = descend_ejection(deadline, clusters);
    if (single + grouped + ejected == 0) break;
    total += single + grouped + ejected;
  }
  return total;
}

}  // namespace autoshard::detail
