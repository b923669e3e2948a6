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
std::vector<int32_t> search_order(const GraphView& g) {
  const int32_t n = g.num_nodes;
  std::vector<int32_t> order;
  std::vector<int32_t> ordered_nbrs(n, 0);
  std::vector<char> done(n, 0);
  order.reserve(n);
  auto degree = [&](int32_t x) { return static_cast<int32_t>(g.adj_offset[x + 1] - g.adj_offset[x]); };
  for (int32_t step = 0; step < n; ++step) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      if (best < 0) {
        best = i;
        continue;
      }
      auto key = [&](int32_t x) {
        return std::make_tuple(-ordered_nbrs[x], ordered_nbrs[x] == 0 ? -degree(x) : 0, g.labels(x), x);
      };
      if (key(i) < key(best)) best = i;
    }
    done[best] = 1;
    order.push_back(best);
    for (int64_t k = g.adj_offset[best]; k < g.adj_offset[best + 1]; ++k) ++ordered_nbrs[g.adj_other[k]];
  }
  return order;
}

// One edge seen from node i (CSR entry k of i's adjacency): its cost with i at label s and
// the neighbour at label t, +infinity when infeasible.
struct Incident {
  const GraphView& g;
  int32_t i;
  int64_t k;
  int32_t other() const { return g.adj_other[k]; }
  double cost(int32_t s, int32_t t) const { return cost_or_inf(g.edge_cost(g.adj_edge[k], i, s, t)); }
};

class BranchAndBound {
 public:
  BranchAndBound(const GraphView& g, const LivePoints& points, bool integer_costs, const Deadline& deadline,
                 const std::vector<int32_t>& order, const std::vector<double>& lambda, double gap_tolerance,
                 double cost_offset)
      : g_(g),
        points_(points),
        limit_(g.usage_limit),
        integer_costs_(integer_costs),
        deadline_(deadline),
        gap_tolerance_(gap_tolerance),
        cost_offset_(cost_offset),
        order_(order) {
    const int32_t n = g.num_nodes;
    pos_.assign(n, 0);
    for (int32_t d = 0; d < n; ++d) pos_[order_[d]] = d;
    // Lagrangian node costs.
    cost_.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      cost_[i].resize(g.labels(i));
      for (int32_t s = 0; s < g.labels(i); ++s) cost_[i][s] = cost_or_inf(g.costs(i)[s]);
    }
    lambda_offset_ = 0;
    if (!lambda.empty()) {
      std::vector<double> prefix(lambda.size() + 1, 0.0);
      for (size_t k = 0; k < lambda.size(); ++k) prefix[k + 1] = prefix[k] + lambda[k];
      for (int32_t i = 0; i < n; ++i) {
        double w = prefix[points.last[i]] - prefix[points.first[i]];
        if (w != 0)
          for (int32_t s = 0; s < g.labels(i); ++s) cost_[i][s] += w * static_cast<double>(g.usages(i)[s]);
      }
      for (double l : lambda) lambda_offset_ += l * static_cast<double>(limit_);
    }
    fut_.resize(n);
    partial_.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      fut_[i].assign(g.labels(i), 0.0);
      for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k) {
        const Incident a{g, i, k};
        if (pos_[a.other()] < pos_[i]) continue;
        for (int32_t s = 0; s < g.labels(i); ++s) {
          double best = kInf;
          for (int32_t t = 0; t < g.labels(a.other()); ++t) best = std::min(best, a.cost(s, t));
          fut_[i][s] += best;
        }
      }
      partial_[i].resize(g.labels(i));
      for (int32_t s = 0; s < g.labels(i); ++s) partial_[i][s] = cost_[i][s] + fut_[i][s];
    }
    min_partial_.resize(n);
    sum_min_ = 0;
    for (int32_t i = 0; i < n; ++i) {
      min_partial_[i] = *std::min_element(partial_[i].begin(), partial_[i].end());
      sum_min_ += min_partial_[i];
    }
    // Memory: slack at each checkpoint after reserving every node's smallest usage.
    umin_.assign(n, 0);
    slack_.assign(points.size(), limit_);
    for (int32_t i = 0; i < n; ++i) {
      umin_[i] = *std::min_element(g.usages(i), g.usages(i) + g.labels(i));
      for (int32_t k = points.first[i]; k < points.last[i]; ++k) slack_[k] -= umin_[i];
    }
    // Budgets: suffix sums of the smallest and largest usage of the nodes not yet assigned.
    const size_t nb = g.budgets.size();
    budget_sum_.assign(nb, 0);
    rest_min_.assign(nb, std::vector<int64_t>(n + 1, 0));
    rest_max_.assign(nb, std::vector<int64_t>(n + 1, 0));
    for (size_t b = 0; b < nb; ++b)
      for (int32_t d = n - 1; d >= 0; --d) {
        const int64_t* row = budget_row(b, order_[d]);
        const int32_t labels = g.labels(order_[d]);
        rest_min_[b][d] = rest_min_[b][d + 1] + *std::min_element(row, row + labels);
        rest_max_[b][d] = rest_max_[b][d + 1] + *std::max_element(row, row + labels);
      }
    plan_.assign(n, 0);
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
    if (limit_ >= 0 && !memory_possible()) return true;
    if (!budget_possible(0)) return true;
    dfs(0, 0.0);
    return !aborted_;
  }
  uint64_t nodes_explored() const { return nodes_; }
  double tolerance_bound() const { return tolerance_bound_; }

 private:
  const int64_t* budget_row(size_t b, int32_t i) const { return g_.budgets[b].usage.data() + g_.label_offset[i]; }

  bool budget_possible(int32_t d) const {
    for (size_t b = 0; b < g_.budgets.size(); ++b) {
      if (budget_sum_[b] + rest_min_[b][d] > g_.budgets[b].high) return false;
      if (budget_sum_[b] + rest_max_[b][d] < g_.budgets[b].low) return false;
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
    const bool proof = integer_costs_ ? bound_proves_optimal(*best_cost_, lb, true)
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
    if (d == g_.num_nodes) {
      // Finite: a choice with an infeasible entry was cut where its partial cost became +inf.
      double c = graph_cost(g_, plan_);
      if (c < *best_cost_) {
        *best_cost_ = c;
        *best_ = plan_;
      }
      return;
    }
    const int32_t i = order_[d];
    const int32_t ns = g_.labels(i);
    const int64_t* usage = g_.usages(i);
    std::vector<int32_t> cand(ns);
    std::iota(cand.begin(), cand.end(), 0);
    std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return partial_[i][a] < partial_[i][b]; });
    const double rest = sum_min_ - min_partial_[i];
    const int32_t live_lo = points_.first[i], live_hi = points_.last[i];
    int64_t min_slack = std::numeric_limits<int64_t>::max();
    for (int32_t k = live_lo; k < live_hi; ++k) min_slack = std::min(min_slack, slack_[k]);

    for (int32_t s : cand) {
      const double p = partial_[i][s];
      if (std::isinf(p)) break;
      if (cannot_improve(g + p + rest - lambda_offset_)) break;  // sorted: the rest are no better
      const int64_t extra = usage[s] - umin_[i];
      if (limit_ >= 0 && extra > 0 && extra > min_slack) continue;
      if (!g_.budgets.empty()) {
        for (size_t b = 0; b < g_.budgets.size(); ++b) budget_sum_[b] += budget_row(b, i)[s];
        bool ok = budget_possible(d + 1);
        if (!ok) {
          for (size_t b = 0; b < g_.budgets.size(); ++b) budget_sum_[b] -= budget_row(b, i)[s];
          continue;
        }
      }
      // Apply: charge the exact part, push the column of every later neighbour.
      plan_[i] = s;
      const double g2 = g + p - fut_[i][s];
      const size_t mark = trail_.size();
      double sum_min = rest;
      bool dead = false;
      for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
        const Incident a{g_, i, k};
        const int32_t j = a.other();
        if (pos_[j] < pos_[i]) continue;
        trail_.push_back({j, partial_[j], min_partial_[j]});
        double mn = kInf;
        for (int32_t t = 0; t < g_.labels(j); ++t) {
          partial_[j][t] += a.cost(s, t);
          mn = std::min(mn, partial_[j][t]);
        }
        sum_min += mn - min_partial_[j];
        min_partial_[j] = mn;
        if (std::isinf(mn)) dead = true;
      }
      if (extra != 0)
        for (int32_t k = live_lo; k < live_hi; ++k) slack_[k] -= extra;
      const double saved_sum = sum_min_;
      sum_min_ = sum_min;
      if (!dead && !cannot_improve(g2 + sum_min - lambda_offset_)) dfs(d + 1, g2);
      sum_min_ = saved_sum;
      if (extra != 0)
        for (int32_t k = live_lo; k < live_hi; ++k) slack_[k] += extra;
      while (trail_.size() > mark) {
        Saved& sv = trail_.back();
        partial_[sv.node].swap(sv.partial);
        min_partial_[sv.node] = sv.min_partial;
        trail_.pop_back();
      }
      for (size_t b = 0; b < g_.budgets.size(); ++b) budget_sum_[b] -= budget_row(b, i)[s];
      if (aborted_) return;
    }
  }

  struct Saved {
    int32_t node;
    std::vector<double> partial;
    double min_partial;
  };

  const GraphView& g_;
  const LivePoints& points_;
  const int64_t limit_;
  const bool integer_costs_;
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
double lagrangian_root(const GraphView& g, const LivePoints& points, const std::vector<int32_t>& pos,
                       const std::vector<double>& lambda, std::vector<double>& grad) {
  const double limit = static_cast<double>(g.usage_limit);
  std::vector<double> prefix(lambda.size() + 1, 0.0);
  for (size_t k = 0; k < lambda.size(); ++k) prefix[k + 1] = prefix[k] + lambda[k];
  grad.assign(lambda.size(), -limit);
  std::vector<double> diff(lambda.size() + 1, 0.0);
  double total = 0;
  for (int32_t i = 0; i < g.num_nodes; ++i) {
    const int32_t lo = points.first[i], hi = points.last[i];
    double w = prefix[hi] - prefix[lo];
    double best = kInf;
    int32_t arg = 0;
    for (int32_t s = 0; s < g.labels(i); ++s) {
      double v = cost_or_inf(g.costs(i)[s]) + w * static_cast<double>(g.usages(i)[s]);
      for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k) {
        const Incident a{g, i, k};
        if (pos[a.other()] < pos[i]) continue;
        double mn = kInf;
        for (int32_t t = 0; t < g.labels(a.other()); ++t) mn = std::min(mn, a.cost(s, t));
        v += mn;
      }
      if (v < best) {
        best = v;
        arg = s;
      }
    }
    total += best;
    if (hi > lo) {
      diff[lo] += static_cast<double>(g.usages(i)[arg]);
      diff[hi] -= static_cast<double>(g.usages(i)[arg]);
    }
  }
  double run = 0;
  for (size_t k = 0; k < lambda.size(); ++k) {
    run += diff[k];
    grad[k] += run;
    total -= lambda[k] * limit;
  }
  return total;
}

}  // namespace

LivePoints limit_points(const GraphView& g) {
  if (g.usage_limit >= 0) return live_points(g);
  LivePoints none;
  none.first.assign(g.num_nodes, 0);
  none.last.assign(g.num_nodes, 0);
  return none;
}

ExactOutcome branch_and_bound(const GraphView& g, bool integer_costs, const Deadline& deadline,
                              std::vector<int32_t> incumbent, double incumbent_cost, double gap_tolerance,
                              double cost_offset) {
  ExactOutcome out;
  out.plan = std::move(incumbent);
  out.cost = incumbent_cost;
  const LivePoints points = limit_points(g);
  const std::vector<int32_t> order = search_order(g);
  std::vector<double> lambda;
  if (g.usage_limit >= 0 && points.size() > 0) {
    // Subgradient ascent on the root bound (Polyak steps toward the incumbent's cost).
    std::vector<int32_t> pos(g.num_nodes);
    for (int32_t d = 0; d < g.num_nodes; ++d) pos[order[d]] = d;
    std::vector<double> lam(points.size(), 0.0), grad, best_lam = lam;
    double best_lb = lagrangian_root(g, points, pos, lam, grad);
    double theta = 1.0;
    const double target = std::isfinite(incumbent_cost) ? incumbent_cost : std::fabs(best_lb) * 2 + 1;
    for (int it = 0; it < 300 && std::isfinite(best_lb) && !deadline.passed(); ++it) {
      double lb = lagrangian_root(g, points, pos, lam, grad);
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
    if (best_lb > lagrangian_root(g, points, pos, std::vector<double>(points.size(), 0.0), grad)) lambda = best_lam;
  }
  BranchAndBound bb(g, points, integer_costs, deadline, order, lambda, gap_tolerance, cost_offset);
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

// Each node's cheapest strategy plus, for every edge charged to its lower-id endpoint, the
// cheapest entry of the row chosen there.
double simple_lower_bound(const GraphView& g) {
  double total = 0;
  for (int32_t i = 0; i < g.num_nodes; ++i) {
    double best = kInf;
    for (int32_t s = 0; s < g.labels(i); ++s) {
      double v = cost_or_inf(g.costs(i)[s]);
      for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k) {
        const Incident a{g, i, k};
        if (a.other() < i) continue;
        double mn = kInf;
        for (int32_t t = 0; t < g.labels(a.other()); ++t) mn = std::min(mn, a.cost(s, t));
        v += mn;
      }
      best = std::min(best, v);
    }
    total += best;
  }
  return total;
}

}  // namespace autoshard::detail
