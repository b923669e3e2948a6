// A quick valid-plan finder: greedy starts, memory repair, and single-node moves that never
// break the memory limit. It seeds the exact search's incumbent (good pruning needs a good
// first plan) and is the dispatcher's fallback when no heuristic engine is linked.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"
#include "exact/exact_model.h"

namespace autoshard {
namespace detail {
namespace {

// Infeasible choices are counted apart from finite cost so that "one fewer infeasible
// choice" is always an improvement and finite costs are never swamped by 1e18 values.
struct LocalCost {
  int64_t infeasible = 0;
  double finite = 0;
  void add(double c) {
    if (std::isinf(c))
      ++infeasible;
    else
      finite += c;
  }
};

class LocalSearch {
 public:
  LocalSearch(const SolverModel& m, const Deadline& deadline) : m_(m), deadline_(deadline) {}

  // Loads a plan and recomputes live usage and budget sums.
  void load(std::vector<int32_t> plan) {
    plan_ = std::move(plan);
    live_.assign(m_.checkpoints.size(), 0);
    for (int32_t i = 0; i < m_.n; ++i)
      for (int32_t k = m_.live_lo[i]; k < m_.live_hi[i]; ++k) live_[k] += m_.usage[i][plan_[i]];
    budget_sum_.assign(m_.budgets.size(), 0);
    for (size_t b = 0; b < m_.budgets.size(); ++b)
      for (int32_t i = 0; i < m_.n; ++i) budget_sum_[b] += m_.budgets[b].usage[i][plan_[i]];
  }
  const std::vector<int32_t>& plan() const { return plan_; }

  bool memory_ok() const {
    if (m_.limit < 0) return true;
    for (int64_t v : live_)
      if (v > m_.limit) return false;
    return true;
  }

  LocalCost local_cost(int32_t i, int32_t s) const {
    LocalCost lc;
    lc.add(m_.cost[i][s]);
    for (const Adjacent& a : m_.adj[i]) lc.add(m_.pair_cost(a, s, plan_[a.other]));
    return lc;
  }

  int64_t budget_violation_delta(int32_t i, int32_t s) const {
    int64_t d = 0;
    for (size_t b = 0; b < m_.budgets.size(); ++b) {
      const BudgetRows& br = m_.budgets[b];
      int64_t before = budget_sum_[b], after = before - br.usage[i][plan_[i]] + br.usage[i][s];
      d += violation(after, br) - violation(before, br);
    }
    return d;
  }

  void move(int32_t i, int32_t s) {
    int64_t du = m_.usage[i][s] - m_.usage[i][plan_[i]];
    if (du != 0)
      for (int32_t k = m_.live_lo[i]; k < m_.live_hi[i]; ++k) live_[k] += du;
    for (size_t b = 0; b < m_.budgets.size(); ++b)
      budget_sum_[b] += m_.budgets[b].usage[i][s] - m_.budgets[b].usage[i][plan_[i]];
    plan_[i] = s;
  }

  // Repeats single-node best moves that keep memory within the limit (when `keep_memory`)
  // until none improves (infeasible count, budget violation, cost) or time runs out.
  void improve(bool keep_memory) {
    for (int pass = 0; pass < 1000 && !deadline_.passed(); ++pass) {
      bool improved = false;
      for (int32_t i = 0; i < m_.n; ++i) {
        if ((i & 255) == 255 && deadline_.passed()) return;
        if (m_.strategies(i) == 1) continue;
        int64_t max_live = std::numeric_limits<int64_t>::min();
        for (int32_t k = m_.live_lo[i]; k < m_.live_hi[i]; ++k) max_live = std::max(max_live, live_[k]);
        const int64_t own = m_.usage[i][plan_[i]];
        LocalCost cur = local_cost(i, plan_[i]);
        int32_t best = plan_[i];
        LocalCost best_c = cur;
        int64_t best_bv = 0;
        for (int32_t s = 0; s < m_.strategies(i); ++s) {
          if (s == plan_[i]) continue;
          if (keep_memory && m_.limit >= 0 && m_.live_hi[i] > m_.live_lo[i] &&
              max_live - own + m_.usage[i][s] > m_.limit && m_.usage[i][s] > own)
            continue;
          int64_t bv = budget_violation_delta(i, s);
          if (bv > 0) continue;
          LocalCost c = local_cost(i, s);
          if (better(c, bv, best_c, best_bv)) {
            best = s;
            best_c = c;
            best_bv = bv;
          }
        }
        if (best != plan_[i]) {
          move(i, best);
          improved = true;
        }
      }
      if (!improved) break;
    }
  }

  // Lowers usage at the worst checkpoint with the cheapest cost per byte saved, until memory
  // fits. Returns false when no move can lower it.
  bool repair_memory() {
    if (m_.limit < 0) return true;
    for (int iter = 0; iter < 100000; ++iter) {
      int32_t worst = -1;
      int64_t excess = 0;
      for (size_t k = 0; k < live_.size(); ++k)
        if (live_[k] - m_.limit > excess) {
          excess = live_[k] - m_.limit;
          worst = static_cast<int32_t>(k);
        }
      if (worst < 0) return true;
      if (deadline_.passed()) return false;
      int32_t best_node = -1, best_s = -1;
      double best_ratio = kInf;
      int64_t best_inf = std::numeric_limits<int64_t>::max();
      // The nodes live at the worst checkpoint, found by a scan: a list per checkpoint held
      // the sum of all live spans (237 M entries, 5.6 s and ~1 GB on IOPDDL P).
      for (int32_t i = 0; i < m_.n; ++i) {
        if (m_.live_lo[i] > worst || worst >= m_.live_hi[i]) continue;
        LocalCost cur = local_cost(i, plan_[i]);
        for (int32_t s = 0; s < m_.strategies(i); ++s) {
          int64_t saved = m_.usage[i][plan_[i]] - m_.usage[i][s];
          if (saved <= 0) continue;
          LocalCost c = local_cost(i, s);
          int64_t dinf = c.infeasible - cur.infeasible;
          double ratio = (c.finite - cur.finite) / static_cast<double>(std::min(saved, excess));
          if (dinf < best_inf || (dinf == best_inf && ratio < best_ratio)) {
            best_inf = dinf;
            best_ratio = ratio;
            best_node = i;
            best_s = s;
          }
        }
      }
      if (best_node < 0) return false;
      move(best_node, best_s);
    }
    return memory_ok();
  }

 private:
  static int64_t violation(int64_t sum, const BudgetRows& br) {
    return std::max<int64_t>(0, br.low - sum) + std::max<int64_t>(0, sum - br.high);
  }
  static bool better(const LocalCost& c, int64_t bv, const LocalCost& best, int64_t best_bv) {
    if (c.infeasible != best.infeasible) return c.infeasible < best.infeasible;
    if (bv != best_bv) return bv < best_bv;
    return c.finite < best.finite - 1e-9 * std::max(1.0, std::fabs(best.finite));
  }

  const SolverModel& m_;
  const Deadline& deadline_;
  std::vector<int32_t> plan_;
  std::vector<int64_t> live_;
  std::vector<int64_t> budget_sum_;
};

// Assigns nodes one by one in breadth-first order. Every unassigned node keeps its smallest
// usage reserved at each checkpoint, so a choice is allowed only when it leaves room for
// them: the plan always fits memory when the smallest usages do. Choices avoid infeasible
// entries with assigned neighbours and with every strategy of unassigned ones.
std::vector<int32_t> constructive_plan(const SolverModel& m, const Deadline& deadline) {
  std::vector<int32_t> order;
  std::vector<char> seen(m.n, 0);
  for (int32_t root = 0; root < m.n; ++root) {
    if (seen[root]) continue;
    seen[root] = 1;
    size_t head = order.size();
    order.push_back(root);
    while (head < order.size()) {
      int32_t i = order[head++];
      for (const Adjacent& a : m.adj[i])
        if (!seen[a.other]) {
          seen[a.other] = 1;
          order.push_back(a.other);
        }
    }
  }
  std::vector<int64_t> umin(m.n), slack(m.checkpoints.size(), m.limit);
  for (int32_t i = 0; i < m.n; ++i) {
    umin[i] = *std::min_element(m.usage[i].begin(), m.usage[i].end());
    for (int32_t k = m.live_lo[i]; k < m.live_hi[i]; ++k) slack[k] -= umin[i];
  }
  std::vector<int32_t> plan(m.n, -1);
  // Domains with arc-consistency propagation: after each choice, strategies of unassigned
  // nodes left without a finite partner are removed (ties between nodes behave like
  // equalities, which single choices would otherwise break further down the order).
  std::vector<std::vector<char>> alive(m.n);
  for (int32_t i = 0; i < m.n; ++i) alive[i].assign(m.strategies(i), 1);
  auto has_partner = [&](const Adjacent& a, int32_t s_node) {
    int32_t j = a.other;
    if (plan[j] >= 0) return !std::isinf(m.pair_cost(a, s_node, plan[j]));
    for (int32_t t = 0; t < m.strategies(j); ++t)
      if (alive[j][t] && !std::isinf(m.pair_cost(a, s_node, t))) return true;
    return false;
  };
  std::vector<int32_t> queue;
  std::vector<char> queued(m.n, 0);
  int64_t propagation_budget = 50'000'000;
  auto propagate = [&](int32_t from) {
    queue.assign(1, from);
    queued[from] = 1;
    while (!queue.empty() && propagation_budget > 0) {
      int32_t j = queue.back();
      queue.pop_back();
      queued[j] = 0;
      for (const Adjacent& a : m.adj[j]) {
        int32_t k = a.other;
        if (plan[k] >= 0) continue;
        // Adjacent seen from k: find k's entry for the same pair.
        Adjacent back{a.pair, j, !a.node_is_a};
        bool changed = false, any = false;
        for (int32_t t = 0; t < m.strategies(k); ++t) {
          if (!alive[k][t]) continue;
          propagation_budget -= m.strategies(j);
          if (!has_partner(back, t)) {
            alive[k][t] = 0;
            changed = true;
          } else
            any = true;
        }
        if (!any) {  // wiped out: give the domain back rather than fail; the plan will be repaired
          std::fill(alive[k].begin(), alive[k].end(), 1);
          continue;
        }
        if (changed && !queued[k]) {
          queued[k] = 1;
          queue.push_back(k);
        }
      }
    }
    for (int32_t q : queue) queued[q] = 0;
    queue.clear();
  };
  for (int32_t i : order) {
    int64_t min_slack = std::numeric_limits<int64_t>::max();
    for (int32_t k = m.live_lo[i]; k < m.live_hi[i]; ++k) min_slack = std::min(min_slack, slack[k]);
    int32_t best = -1;
    LocalCost best_c;
    bool best_fits = false;
    for (int32_t s = 0; s < m.strategies(i); ++s) {
      int64_t extra = m.usage[i][s] - umin[i];
      bool fits = !(m.limit >= 0 && extra > 0 && extra > min_slack);
      LocalCost c;
      c.add(m.cost[i][s]);
      if (!alive[i][s]) ++c.infeasible;
      for (const Adjacent& a : m.adj[i]) {
        if (plan[a.other] >= 0) {
          c.add(m.pair_cost(a, s, plan[a.other]));
          continue;
        }
        double mn = kInf;
        for (int32_t t = 0; t < m.strategies(a.other); ++t)
          if (alive[a.other][t]) mn = std::min(mn, m.pair_cost(a, s, t));
        c.add(mn);
      }
      bool better_choice = best < 0 || (fits && !best_fits) ||
                           (fits == best_fits && (c.infeasible < best_c.infeasible ||
                                                  (c.infeasible == best_c.infeasible && c.finite < best_c.finite)));
      if (better_choice) {
        best = s;
        best_c = c;
        best_fits = fits;
      }
    }
    plan[i] = best;
    int64_t extra = m.usage[i][best] - umin[i];
    if (extra != 0)
      for (int32_t k = m.live_lo[i]; k < m.live_hi[i]; ++k) slack[k] -= extra;
    // propagate(i) is left out: measured on IOPDDL A and L it made valid plans rarer, since a
    // wiped-out domain is restored and the choice order then forces conflicts elsewhere.
    (void)propagate;
    if (deadline.passed()) {  // finish cheaply: smallest usage for the rest
      for (int32_t j = 0; j < m.n; ++j)
        if (plan[j] < 0)
          plan[j] = static_cast<int32_t>(std::min_element(m.usage[j].begin(), m.usage[j].end()) - m.usage[j].begin());
      break;
    }
  }
  return plan;
}

}  // namespace

// Shared by solve_greedy and the exact search's warm start.
std::vector<std::vector<int32_t>> greedy_plans(const SolverModel& m, const Deadline& deadline) {
  std::vector<std::vector<int32_t>> out;
  LocalSearch ls(m, deadline);
  // Start 0: constructive, memory-safe by reservation.
  ls.load(constructive_plan(m, deadline));
  if (ls.memory_ok()) {
    ls.improve(true);
    out.push_back(ls.plan());
  }
  // Start 1: cheapest node cost, improved ignoring memory, then repaired and improved.
  std::vector<int32_t> plan(m.n, 0);
  for (int32_t i = 0; i < m.n; ++i)
    plan[i] = static_cast<int32_t>(std::min_element(m.cost[i].begin(), m.cost[i].end()) - m.cost[i].begin());
  ls.load(plan);
  ls.improve(false);
  if (ls.repair_memory()) {
    ls.improve(true);
    out.push_back(ls.plan());
  }
  // Start 2: the smallest usage among finite-cost strategies: fits memory whenever anything does.
  for (int32_t i = 0; i < m.n; ++i) {
    int32_t best = 0;
    for (int32_t s = 1; s < m.strategies(i); ++s) {
      auto key = [&](int32_t x) { return std::make_tuple(std::isinf(m.cost[i][x]), m.usage[i][x], m.cost[i][x]); };
      if (key(s) < key(best)) best = s;
    }
    plan[i] = best;
  }
  ls.load(plan);
  if (ls.repair_memory()) {
    ls.improve(true);
    out.push_back(ls.plan());
  }
  return out;
}

}  // namespace detail

SolveResult solve_greedy(const Problem& problem, const SolveOptions& options) {
  detail::Deadline deadline;
  deadline.limit_s = options.time_limit_s;
  SolveResult r;
  // Runs on the unreduced problem: measured on IOPDDL A, the reduced one led the greedy to
  // plans with infeasible entries more often.
  detail::SolverModel m = detail::build_model(problem);
  for (const auto& plan : detail::greedy_plans(m, deadline)) {
    Evaluation ev = evaluate(problem, plan);
    if (!ev.valid) continue;
    if (!r.found || ev.cost < r.cost) {
      if (!r.found) r.time_to_first_s = deadline.elapsed();
      r.found = true;
      r.solution = plan;
      r.cost = ev.cost;
      r.peak_usage = ev.peak_usage;
    }
  }
  r.status = r.found ? "heuristic" : "no valid plan found";
  r.total_time_s = deadline.elapsed();
  return r;
}

}  // namespace autoshard
