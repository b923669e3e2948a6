// A quick valid-plan finder: greedy starts, memory repair, and single-node moves that never
// break the memory limit. It seeds the exact search's incumbent (good pruning needs a good
// first plan) and is the dispatcher's fallback when no heuristic engine is linked.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "autoshard/evaluate.h"
#include "autoshard/exact.h"
#include "exact/exact_search.h"
#include "heuristic/local_search.h"
#include "heuristic/memory_profile.h"

namespace autoshard {
namespace detail {
namespace {

// Infeasible choices are counted apart from finite cost so that "one fewer infeasible
// choice" is always an improvement and finite costs are never swamped by 1e18 values.
struct LocalCost {
  int64_t infeasible = 0;
  double finite = 0;
  void add(Cost c) {
    if (is_infeasible(c))
      ++infeasible;
    else
      finite += c;
  }
};

// The strategy usages as the problem gives them: the view zeroes those of nodes never live.
int64_t given_usage(const Problem& p, int32_t i, int32_t s) {
  return static_cast<size_t>(i) < p.node_usages.size() && !p.node_usages[i].empty() ? p.node_usages[i][s] : 0;
}

// The greedy's move rules over PlanState (plan, live-usage profile and budget sums kept up to
// date): best single-node moves ranked by infeasible count, budget violation, then cost, and
// a memory repair by cost per byte saved.
class LocalSearch {
 public:
  LocalSearch(const GraphView& g, const Deadline& deadline)
      : g_(g), deadline_(deadline), memory_(g, g.usage_limit), state_(g, memory_) {}

  void load(const std::vector<int32_t>& plan) { state_.reset(plan); }
  const std::vector<int32_t>& plan() const { return state_.labels(); }
  bool memory_ok() const { return state_.memory_ok(); }

  LocalCost local_cost(int32_t i, int32_t s) const {
    const std::vector<int32_t>& x = plan();
    LocalCost lc;
    lc.add(g_.costs(i)[s]);
    for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k)
      lc.add(g_.edge_cost(g_.adj_edge[k], i, s, x[g_.adj_other[k]]));
    return lc;
  }

  int64_t budget_violation_delta(int32_t i, int32_t s) const {
    int64_t d = 0;
    for (size_t b = 0; b < g_.budgets.size(); ++b) {
      const GraphView::Budget& br = g_.budgets[b];
      const int64_t* u = br.usage.data() + g_.label_offset[i];
      int64_t before = state_.budget_sum(b), after = before - u[plan()[i]] + u[s];
      d += violation(after, br) - violation(before, br);
    }
    return d;
  }

  void move(int32_t i, int32_t s) { state_.move(i, s, state_.move_delta(i, s)); }

  // Repeats single-node best moves that keep memory within the limit (when `keep_memory`)
  // until none improves (infeasible count, budget violation, cost) or time runs out.
  void improve(bool keep_memory) {
    const std::vector<int32_t>& x = plan();
    for (int pass = 0; pass < 1000 && !deadline_.passed(); ++pass) {
      bool improved = false;
      for (int32_t i = 0; i < g_.num_nodes; ++i) {
        if ((i & 255) == 255 && deadline_.passed()) return;
        if (g_.labels(i) == 1) continue;
        LocalCost cur = local_cost(i, x[i]);
        int32_t best = x[i];
        LocalCost best_c = cur;
        int64_t best_bv = 0;
        for (int32_t s = 0; s < g_.labels(i); ++s) {
          if (s == x[i]) continue;
          if (keep_memory && !memory_.fits(i, x[i], s)) continue;
          int64_t bv = budget_violation_delta(i, s);
          if (bv > 0) continue;
          LocalCost c = local_cost(i, s);
          if (better(c, bv, best_c, best_bv)) {
            best = s;
            best_c = c;
            best_bv = bv;
          }
        }
        if (best != x[i]) {
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
    if (!memory_.limited()) return true;
    const std::vector<int32_t>& x = plan();
    for (int iter = 0; iter < 100000; ++iter) {
      if (memory_.peak() <= memory_.limit()) return true;
      const int32_t worst = memory_.peak_point();  // the first checkpoint with the largest excess
      const int64_t excess = memory_.peak() - memory_.limit();
      if (deadline_.passed()) return false;
      int32_t best_node = -1, best_s = -1;
      double best_ratio = kInf;
      int64_t best_inf = std::numeric_limits<int64_t>::max();
      // The nodes live at the worst checkpoint, found by a scan: a list per checkpoint held
      // the sum of all live spans (237 M entries, 5.6 s and ~1 GB on IOPDDL P).
      for (int32_t i = 0; i < g_.num_nodes; ++i) {
        if (memory_.first(i) > worst || worst >= memory_.last(i)) continue;
        const int64_t* u = g_.usages(i);
        LocalCost cur = local_cost(i, x[i]);
        for (int32_t s = 0; s < g_.labels(i); ++s) {
          int64_t saved = u[x[i]] - u[s];
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
  static int64_t violation(int64_t sum, const GraphView::Budget& br) {
    return std::max<int64_t>(0, br.low - sum) + std::max<int64_t>(0, sum - br.high);
  }
  static bool better(const LocalCost& c, int64_t bv, const LocalCost& best, int64_t best_bv) {
    if (c.infeasible != best.infeasible) return c.infeasible < best.infeasible;
    if (bv != best_bv) return bv < best_bv;
    return c.finite < best.finite - 1e-9 * std::max(1.0, std::fabs(best.finite));
  }

  const GraphView& g_;
  const Deadline& deadline_;
  MemoryProfile memory_;
  PlanState state_;
};

// Assigns nodes one by one in breadth-first order. Every unassigned node keeps its smallest
// usage reserved at each checkpoint, so a choice is allowed only when it leaves room for
// them: the plan always fits memory when the smallest usages do. Choices avoid infeasible
// entries with assigned neighbours and with every strategy of unassigned ones. (Arc-consistency
// propagation after each choice was measured on IOPDDL A and L and left out: it made valid
// plans rarer, since a wiped-out domain is restored and the choice order then forces
// conflicts elsewhere.)
std::vector<int32_t> constructive_plan(const GraphView& g, const Problem& p, const Deadline& deadline) {
  const int32_t n = g.num_nodes;
  const int64_t limit = g.usage_limit;
  const LivePoints points = limit_points(g);
  std::vector<int32_t> order;
  std::vector<char> seen(n, 0);
  for (int32_t root = 0; root < n; ++root) {
    if (seen[root]) continue;
    seen[root] = 1;
    size_t head = order.size();
    order.push_back(root);
    while (head < order.size()) {
      int32_t i = order[head++];
      for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k)
        if (!seen[g.adj_other[k]]) {
          seen[g.adj_other[k]] = 1;
          order.push_back(g.adj_other[k]);
        }
    }
  }
  std::vector<int64_t> umin(n), slack(points.size(), limit);
  for (int32_t i = 0; i < n; ++i) {
    umin[i] = *std::min_element(g.usages(i), g.usages(i) + g.labels(i));
    for (int32_t k = points.first[i]; k < points.last[i]; ++k) slack[k] -= umin[i];
  }
  std::vector<int32_t> plan(n, -1);
  for (int32_t i : order) {
    const int64_t* usage = g.usages(i);
    int64_t min_slack = std::numeric_limits<int64_t>::max();
    for (int32_t k = points.first[i]; k < points.last[i]; ++k) min_slack = std::min(min_slack, slack[k]);
    int32_t best = -1;
    LocalCost best_c;
    bool best_fits = false;
    for (int32_t s = 0; s < g.labels(i); ++s) {
      int64_t extra = usage[s] - umin[i];
      bool fits = !(limit >= 0 && extra > 0 && extra > min_slack);
      LocalCost c;
      c.add(g.costs(i)[s]);
      for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k) {
        const int32_t e = g.adj_edge[k], j = g.adj_other[k];
        if (plan[j] >= 0) {
          c.add(g.edge_cost(e, i, s, plan[j]));
          continue;
        }
        Cost mn = kInf;
        for (int32_t t = 0; t < g.labels(j); ++t) mn = std::min(mn, g.edge_cost(e, i, s, t));
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
    int64_t extra = usage[best] - umin[i];
    if (extra != 0)
      for (int32_t k = points.first[i]; k < points.last[i]; ++k) slack[k] -= extra;
    if (deadline.passed()) {  // finish cheaply: smallest usage (as given) for the rest
      for (int32_t j = 0; j < n; ++j) {
        if (plan[j] >= 0) continue;
        plan[j] = 0;
        for (int32_t s = 1; s < g.labels(j); ++s)
          if (given_usage(p, j, s) < given_usage(p, j, plan[j])) plan[j] = s;
      }
      break;
    }
  }
  return plan;
}

}  // namespace

// Shared by solve_greedy and the exact search's warm start.
std::vector<std::vector<int32_t>> greedy_plans(const GraphView& g, const Problem& p, const Deadline& deadline) {
  const int32_t n = g.num_nodes;
  std::vector<std::vector<int32_t>> out;
  LocalSearch ls(g, deadline);
  // Start 0: constructive, memory-safe by reservation.
  ls.load(constructive_plan(g, p, deadline));
  if (ls.memory_ok()) {
    ls.improve(true);
    out.push_back(ls.plan());
  }
  // Start 1: cheapest node cost, improved ignoring memory, then repaired and improved.
  std::vector<int32_t> plan(n, 0);
  for (int32_t i = 0; i < n; ++i)
    plan[i] = static_cast<int32_t>(std::min_element(g.costs(i), g.costs(i) + g.labels(i)) - g.costs(i));
  ls.load(plan);
  ls.improve(false);
  if (ls.repair_memory()) {
    ls.improve(true);
    out.push_back(ls.plan());
  }
  // Start 2: the smallest usage among finite-cost strategies: fits memory whenever anything does.
  for (int32_t i = 0; i < n; ++i) {
    const Cost* cost = g.costs(i);
    auto key = [&](int32_t x) { return std::make_tuple(is_infeasible(cost[x]), given_usage(p, i, x), cost[x]); };
    int32_t best = 0;
    for (int32_t s = 1; s < g.labels(i); ++s)
      if (key(s) < key(best)) best = s;
    plan[i] = best;
  }
  ls.load(plan);
  if (ls.repair_memory()) {
    ls.improve(true);
    out.push_back(ls.plan());
  }
  return out;
}

SolveResult solve_greedy(const Problem& problem, const GraphView& g, const Deadline& deadline) {
  SolveResult r;
  for (const auto& plan : greedy_plans(g, problem, deadline)) {
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

}  // namespace detail

SolveResult solve_greedy(const Problem& problem, const SolveOptions& options) {
  detail::Deadline deadline;
  deadline.limit_s = options.time_limit_s;
  // Runs on the unreduced problem: measured on IOPDDL A, the reduced one led the greedy to
  // plans with infeasible entries more often.
  const detail::GraphView g = detail::build_referencing_view(problem);
  return detail::solve_greedy(problem, g, deadline);
}

}  // namespace autoshard
