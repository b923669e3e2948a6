// Depth-first branch and bound over a static variable order.
//
// Bound: with nodes in a fixed order, every edge is charged to its earlier endpoint as
// min over the later endpoint's strategies. For an unassigned node i the term
//   partial[i][s] = cost_i(s) + sum_{later nbr j} min_t m_ij(s, t) + sum_{assigned nbr j} m_ij(s, s_j)
// is a lower bound on what i and its edges to later nodes add, so
//   LB = (exact cost of the assigned part) + sum_{unassigned i} min_s partial[i][s]
// never exceeds the cost of any completion. Memory enters twice: each assignment must leave
// room for every unassigned live node's smallest usage at every checkpoint (exact
// feasibility pruning), and Lagrangian multipliers lambda_k >= 0 on the checkpoint
// constraints (found by subgradient steps at the root) move memory pressure into node costs:
// cost_i(s) + sum_{k live} lambda_k usage_i(s), minus sum_k lambda_k limit, which is still a
// lower bound for every plan that fits.
#include "exact/exact_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

namespace autoshard::detail {
namespace {

// Maximum-cardinality order: next the node with the most already-ordered neighbours (ties:
// fewer strategies, then lower id), so edges are resolved early and the bound tightens fast.
std::vector<int32_t> search_order(const SolverModel& m) {
  std::vector<int32_t> order;
  std::vector<int32_t> ordered_nbrs(m.n, 0);
  std::vector<char> done(m.n, 0);
  order.reserve(m.n);
  for (int32_t step = 0; step < m.n; ++step) {
    int32_t best = -1;
    for (int32_t i = 0; i < m.n; ++i) {
      if (done[i]) continue;
      if (best < 0) {
        best = i;
        continue;
      }
      auto key = [&](int32_t x) {
        return std::make_tuple(-ordered_nbrs[x], ordered_nbrs[x] == 0 ? -static_cast<int32_t>(m.adj[x].size()) : 0,
                               m.strategies(x), x);
      };
      if (key(i) < key(best)) best = i;
    }
    done[best] = 1;
    order.push_back(best);
    for (const Adjacent& a : m.adj[best]) ++ordered_nbrs[a.other];
  }
  return order;
}

class BranchAndBound {
 public:
  BranchAndBound(const SolverModel& m, const Deadline& deadline, const std::vector<double>& lambda,
                 double gap_tolerance, double cost_offset)
      : m_(m), deadline_(deadline), gap_tolerance_(gap_tolerance), cost_offset_(cost_offset) {
    order_ = search_order(m);
    pos_.assign(m.n, 0);
    for (int32_t d = 0; d < m.n; ++d) pos_[order_[d]] = d;
    // Lagrangian node costs.
    cost_ = m.cost;
    lambda_offset_ = 0;
    if (!lambda.empty()) {
      std::vector<double> prefix(lambda.size() + 1, 0.0);
      for (size_t k = 0; k < lambda.size(); ++k) prefix[k + 1] = prefix[k] + lambda[k];
      for (int32_t i = 0; i < m.n; ++i) {
        double w = prefix[m.live_hi[i]] - prefix[m.live_lo[i]];
        if (w != 0)
          for (int32_t s = 0; s < m.strategies(i); ++s) cost_[i][s] += w * static_cast<double>(m.usage[i][s]);
      }
      for (double l : lambda) lambda_offset_ += l * static_cast<double>(m.limit);
    }
    fut_.resize(m.n);
    partial_.resize(m.n);
    for (int32_t i = 0; i < m.n; ++i) {
      fut_[i].assign(m.strategies(i), 0.0);
      for (const Adjacent& a : m.adj[i]) {
        if (pos_[a.other] < pos_[i]) continue;
        for (int32_t s = 0; s < m.strategies(i); ++s) {
          double best = kInf;
          for (int32_t t = 0; t < m.strategies(a.other); ++t) best = std::min(best, m.pair_cost(a, s, t));
          fut_[i][s] += best;
        }
      }
      partial_[i].resize(m.strategies(i));
      for (int32_t s = 0; s < m.strategies(i); ++s) partial_[i][s] = cost_[i][s] + fut_[i][s];
    }
    min_partial_.resize(m.n);
    sum_min_ = 0;
    for (int32_t i = 0; i < m.n; ++i) {
      min_partial_[i] = *std::min_element(partial_[i].begin(), partial_[i].end());
      sum_min_ += min_partial_[i];
    }
    // Memory: slack at each checkpoint after reserving every node's smallest usage.
    umin_.assign(m.n, 0);
    slack_.assign(m.checkpoints.size(), m.limit);
    for (int32_t i = 0; i < m.n; ++i) {
      umin_[i] = *std::min_element(m.usage[i].begin(), m.usage[i].end());
      for (int32_t k = m.live_lo[i]; k < m.live_hi[i]; ++k) slack_[k] -= umin_[i];
    }
    // Budgets: suffix sums of the smallest and largest usage of the nodes not yet assigned.
    const size_t nb = m.budgets.size();
    budget_sum_.assign(nb, 0);
    rest_min_.assign(nb, std::vector<int64_t>(m.n + 1, 0));
    rest_max_.assign(nb, std::vector<int64_t>(m.n + 1, 0));
    for (size_t b = 0; b < nb; ++b)
      for (int32_t d = m.n - 1; d >= 0; --d) {
        const auto& row = m.budgets[b].usage[order_[d]];
        rest_min_[b][d] = rest_min_[b][d + 1] + *std::min_element(row.begin(), row.end());
        rest_max_[b][d] = rest_max_[b][d + 1] + *std::max_element(row.begin(), row.end());
      }
    plan_.assign(m.n, 0);
  }

  double root_bound() const { return sum_min_ - lambda_offset_; }
  bool memory_possible() const {
    for (int64_t s : slack_)
      if (s < 0) return false;
    return true;
  }

  // Runs the search; `incumbent`/`best_cost` are improved in place. Returns true when the
  // search space was exhausted (so the incumbent, if any, is optimal).
  bool run(std::vector<int32_t>& incumbent, double& best_cost) {
    best_ = &incumbent;
    best_cost_ = &best_cost;
    if (m_.limit >= 0 && !memory_possible()) return true;
    if (!budget_possible(0)) return true;
    dfs(0, 0.0);
    return !aborted_;
  }
  uint64_t nodes_explored() const { return nodes_; }
  double tolerance_bound() const { return tolerance_bound_; }

 private:
  bool budget_possible(int32_t d) const {
    for (size_t b = 0; b < m_.budgets.size(); ++b) {
      if (budget_sum_[b] + rest_min_[b][d] > m_.budgets[b].high) return false;
      if (budget_sum_[b] + rest_max_[b][d] < m_.budgets[b].low) return false;
    }
    return true;
  }

  // Prune when the bound cannot beat the incumbent, up to floating-point noise in the bound.
  // With integer costs a better plan costs at least one unit less, so a bound above
  // best - 1 (plus the noise allowance) prunes; a relative tolerance alone would prune plans
  // up to 1e-9 * cost cheaper (thousands of units on large IOPDDL costs).
  // Within the gap tolerance, a branch is cut too, and its bound remembered: the smallest
  // such bound is what the search proves then.
  bool cannot_improve(double lb) {
    if (std::isinf(*best_cost_)) return std::isinf(lb);
    const bool proof = m_.integer_costs ? bound_proves_optimal(*best_cost_, lb, true)
                                        : lb >= *best_cost_ - 1e-9 * std::max(1.0, std::fabs(*best_cost_));
    if (proof) return true;
    if (gap_tolerance_ > 0 && lb >= *best_cost_ - gap_tolerance_ * std::fabs(*best_cost_ + cost_offset_)) {
      tolerance_bound_ = std::min(tolerance_bound_, lb);
      return true;
    }
    return false;
  }

  void dfs(int32_t d, double g) {
    if (aborted_) return;
    if ((++nodes_ & 1023) == 0 && deadline_.passed()) {
      aborted_ = true;
      return;
    }
    if (d == m_.n) {
      double c = model_cost(m_, plan_);
      if (c < *best_cost_) {
        *best_cost_ = c;
        *best_ = plan_;
      }
      return;
    }
    const int32_t i = order_[d];
    const int32_t ns = m_.strategies(i);
    std::vector<int32_t> cand(ns);
    std::iota(cand.begin(), cand.end(), 0);
    std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return partial_[i][a] < partial_[i][b]; });
    const double rest = sum_min_ - min_partial_[i];
    int64_t min_slack = std::numeric_limits<int64_t>::max();
    for (int32_t k = m_.live_lo[i]; k < m_.live_hi[i]; ++k) min_slack = std::min(min_slack, slack_[k]);

    for (int32_t s : cand) {
      const double p = partial_[i][s];
      if (std::isinf(p)) break;
      if (cannot_improve(g + p + rest - lambda_offset_)) break;  // sorted: the rest are no better
      const int64_t extra = m_.usage[i][s] - umin_[i];
      if (m_.limit >= 0 && extra > 0 && extra > min_slack) continue;
      if (!m_.budgets.empty()) {
        for (size_t b = 0; b < m_.budgets.size(); ++b) budget_sum_[b] += m_.budgets[b].usage[i][s];
        bool ok = budget_possible(d + 1);
        if (!ok) {
          for (size_t b = 0; b < m_.budgets.size(); ++b) budget_sum_[b] -= m_.budgets[b].usage[i][s];
          continue;
        }
      }
      // Apply: charge the exact part, push the column of every later neighbour.
      plan_[i] = s;
      const double g2 = g + p - fut_[i][s];
      const size_t mark = trail_.size();
      double sum_min = rest;
      bool dead = false;
      for (const Adjacent& a : m_.adj[i]) {
        const int32_t j = a.other;
        if (pos_[j] < pos_[i]) continue;
        trail_.push_back({j, partial_[j], min_partial_[j]});
        double mn = kInf;
        for (int32_t t = 0; t < m_.strategies(j); ++t) {
          partial_[j][t] += m_.pair_cost(a, s, t);
          mn = std::min(mn, partial_[j][t]);
        }
        sum_min += mn - min_partial_[j];
        min_partial_[j] = mn;
        if (std::isinf(mn)) dead = true;
      }
      if (extra != 0)
        for (int32_t k = m_.live_lo[i]; k < m_.live_hi[i]; ++k) slack_[k] -= extra;
      const double saved_sum = sum_min_;
      sum_min_ = sum_min;
      if (!dead && !cannot_improve(g2 + sum_min - lambda_offset_)) dfs(d + 1, g2);
      sum_min_ = saved_sum;
      if (extra != 0)
        for (int32_t k = m_.live_lo[i]; k < m_.live_hi[i]; ++k) slack_[k] += extra;
      while (trail_.size() > mark) {
        Saved& sv = trail_.back();
        partial_[sv.node].swap(sv.partial);
        min_partial_[sv.node] = sv.min_partial;
        trail_.pop_back();
      }
      for (size_t b = 0; b < m_.budgets.size(); ++b) budget_sum_[b] -= m_.budgets[b].usage[i][s];
      if (aborted_) return;
    }
  }

  struct Saved {
    int32_t node;
    std::vector<double> partial;
    double min_partial;
  };

  const SolverModel& m_;
  const Deadline& deadline_;
  const double gap_tolerance_, cost_offset_;
  double tolerance_bound_ = kInf;
  std::vector<int32_t> order_, pos_;
  std::vector<std::vector<double>> cost_, fut_, partial_;
  std::vector<double> min_partial_;
  double sum_min_ = 0, lambda_offset_ = 0;
  std::vector<int64_t> umin_, slack_;
  std::vector<int64_t> budget_sum_;
  std::vector<std::vector<int64_t>> rest_min_, rest_max_;
  std::vector<int32_t> plan_;
  std::vector<Saved> trail_;
  std::vector<int32_t>* best_ = nullptr;
  double* best_cost_ = nullptr;
  uint64_t nodes_ = 0;
  bool aborted_ = false;
};

// Root bound for given multipliers, and its subgradient (usage of the bound's argmins minus
// the limit, per checkpoint).
double lagrangian_root(const SolverModel& m, const std::vector<int32_t>& pos, const std::vector<double>& lambda,
                       std::vector<double>& grad) {
  std::vector<double> prefix(lambda.size() + 1, 0.0);
  for (size_t k = 0; k < lambda.size(); ++k) prefix[k + 1] = prefix[k] + lambda[k];
  grad.assign(lambda.size(), static_cast<double>(-m.limit));
  std::vector<double> diff(lambda.size() + 1, 0.0);
  double total = 0;
  for (int32_t i = 0; i < m.n; ++i) {
    double w = prefix[m.live_hi[i]] - prefix[m.live_lo[i]];
    double best = kInf;
    int32_t arg = 0;
    for (int32_t s = 0; s < m.strategies(i); ++s) {
      double v = m.cost[i][s] + w * static_cast<double>(m.usage[i][s]);
      for (const Adjacent& a : m.adj[i]) {
        if (pos[a.other] < pos[i]) continue;
        double mn = kInf;
        for (int32_t t = 0; t < m.strategies(a.other); ++t) mn = std::min(mn, m.pair_cost(a, s, t));
        v += mn;
      }
      if (v < best) {
        best = v;
        arg = s;
      }
    }
    total += best;
    if (m.live_hi[i] > m.live_lo[i]) {
      diff[m.live_lo[i]] += static_cast<double>(m.usage[i][arg]);
      diff[m.live_hi[i]] -= static_cast<double>(m.usage[i][arg]);
    }
  }
  double run = 0;
  for (size_t k = 0; k < lambda.size(); ++k) {
    run += diff[k];
    grad[k] += run;
    total -= lambda[k] * static_cast<double>(m.limit);
  }
  return total;
}

}  // namespace

ExactOutcome branch_and_bound(const SolverModel& m, const Deadline& deadline, std::vector<int32_t> incumbent,
                              double incumbent_cost, double gap_tolerance, double cost_offset) {
  ExactOutcome out;
  out.plan = std::move(incumbent);
  out.cost = incumbent_cost;
  std::vector<double> lambda;
  if (m.has_memory()) {
    // Subgradient ascent on the root bound (Polyak steps toward the incumbent's cost).
    std::vector<int32_t> order = search_order(m);
    std::vector<int32_t> pos(m.n);
    for (int32_t d = 0; d < m.n; ++d) pos[order[d]] = d;
    std::vector<double> lam(m.checkpoints.size(), 0.0), grad, best_lam = lam;
    double best_lb = lagrangian_root(m, pos, lam, grad);
    double theta = 1.0;
    const double target = std::isfinite(incumbent_cost) ? incumbent_cost : std::fabs(best_lb) * 2 + 1;
    for (int it = 0; it < 300 && std::isfinite(best_lb) && !deadline.passed(); ++it) {
      double lb = lagrangian_root(m, pos, lam, grad);
      if (lb > best_lb) {
        best_lb = lb;
        best_lam = lam;
      }
      double norm = 0;
      for (size_t k = 0; k < grad.size(); ++k)
        if (lam[k] > 0 || grad[k] > 0) norm += grad[k] * grad[k];
      if (norm == 0) break;
      double step = theta * std::max(target - lb, 1e-9 * std::fabs(target)) / norm;
      for (size_t k = 0; k < lam.size(); ++k) lam[k] = std::max(0.0, lam[k] + step * grad[k]);
      if (it % 20 == 19) theta *= 0.7;
    }
    if (best_lb > lagrangian_root(m, pos, std::vector<double>(m.checkpoints.size(), 0.0), grad)) lambda = best_lam;
  }
  BranchAndBound bb(m, deadline, lambda, gap_tolerance, cost_offset);
  out.lower_bound = bb.root_bound();
  out.complete = bb.run(out.plan, out.cost);
  out.nodes = bb.nodes_explored();
  out.tolerance_bound = bb.tolerance_bound();
  if (out.complete)
    out.lower_bound = std::min(out.cost, out.tolerance_bound);  // +inf when nothing fits
  else if (std::isfinite(out.cost))
    out.lower_bound = std::min(out.lower_bound, out.cost);
  return out;
}

}  // namespace autoshard::detail

namespace autoshard::detail {
// A bound that needs no search: each node's cheapest strategy plus, for every edge charged to
// its lower-id endpoint, the cheapest entry of the row chosen there.
double simple_lower_bound(const SolverModel& m) {
  double total = 0;
  for (int32_t i = 0; i < m.n; ++i) {
    double best = kInf;
    for (int32_t s = 0; s < m.strategies(i); ++s) {
      double v = m.cost[i][s];
      for (const Adjacent& a : m.adj[i]) {
        if (a.other < i) continue;
        double mn = kInf;
        for (int32_t t = 0; t < m.strategies(a.other); ++t) mn = std::min(mn, m.pair_cost(a, s, t));
        v += mn;
      }
      best = std::min(best, v);
    }
    total += best;
  }
  return total;
}
}  // namespace autoshard::detail
