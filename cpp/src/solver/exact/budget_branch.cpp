#include "exact/budget_branch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <queue>
#include <string>

#include "autoshard/reduce.h"
#include "heuristic/memory_profile.h"
#include "heuristic/trws.h"

namespace autoshard::detail {

int32_t branching_budget(const GraphView& g, int64_t usage_limit) {
  if (usage_limit >= 0 && std::any_of(g.usage.begin(), g.usage.end(), [](int64_t u) { return u > 0; })) return -1;
  int32_t found = -1;
  for (size_t k = 0; k < g.budgets.size(); ++k) {
    if (!budget_can_bind(g, k)) continue;  // every plan meets it
    if (found >= 0) return -1;
    found = static_cast<int32_t>(k);
  }
  return found;
}

namespace {

constexpr Cost kInf = std::numeric_limits<Cost>::infinity();

// A node's budget usage must lie in [lo, hi], and with label >= 0 the node must take that
// label (or, with exclude, any other); several on one node intersect.
struct Fix {
  int32_t node;
  int64_t lo, hi;
  int32_t label = -1;
  bool exclude = false;
};
constexpr int64_t kAnyLo = std::numeric_limits<int64_t>::min(), kAnyHi = std::numeric_limits<int64_t>::max();

struct Open {
  Cost bound;
  int64_t id;
  double mu;  // the parent's best multiplier: where this node's search starts
  std::vector<Fix> fixes;
};
struct WorseFirst {  // priority_queue keeps the largest on top: smallest bound, then oldest
  bool operator()(const Open& a, const Open& b) const { return a.bound != b.bound ? a.bound > b.bound : a.id > b.id; }
};

// The decoded plan of the Lagrangian problem at one multiplier, with the proven bound there.
struct Point {
  double mu = 0;
  Cost bound = -kInf;      // proven for the node's plans within the budget (knapsack_bound)
  std::vector<int32_t> x;  // the decoded plan with the lowest penalised cost
  Cost value = kInf;       // its cost (kInf when it takes an excluded or infeasible label)
  int64_t usage = 0;       // its budget usage
  Cost penalised = kInf;
};

// Most TRW-S sweeps per multiplier; warm-started messages usually settle in a few.
constexpr int kMaxSweeps = 100;
// Bound checks (every other sweep) without progress after which a multiplier is settled.
constexpr int kFlatChecks = 3;
// Most multipliers tried per branch-and-bound node (bracketing plus cutting planes).
constexpr int kMaxPoints = 40;

class Brancher {
 public:
  Brancher(const GraphView& g, int32_t budget, const BudgetBranchConfig& config)
      : g_(g),
        bud_(g.budgets[budget]),
        cfg_(config),
        trws_(g),
        memory_(g, -1),
        state_(g, memory_),
        allowed_(g.node_cost.size(), 1),
        unary_(g.node_cost.size(), 0.0) {
    for (int64_t e = 0; e < g.num_edges(); ++e)
      one_sweep_ += 2 * int64_t(g.labels(g.edge_a[e])) * g.labels(g.edge_b[e]);
    for (int32_t i = 0; i < g.num_nodes; ++i)
      one_sweep_ += 3 * int64_t(g.labels(i)) * (1 + g.adj_offset[i + 1] - g.adj_offset[i]);
    double cost_scale = 0, usage_scale = 0;
    for (Cost c : g.node_cost)
      if (!is_infeasible(c)) cost_scale = std::max(cost_scale, std::abs(c));
    for (int64_t u : bud_.usage) usage_scale = std::max(usage_scale, double(u));
    mu_unit_ = usage_scale > 0 ? std::max(1e-12, 1e-4 * std::max(1.0, cost_scale) / usage_scale) : 1.0;
    // Excluded labels cost more than any whole plan instead of being infeasible (1e18): the
    // bound stays valid for any penalty (it only relaxes the exclusion), and huge values
    // would cancel in TRW-S's sums and cost the bound its precision (an invalid bound).
    double total = 0;
    for (int32_t i = 0; i < g.num_nodes; ++i) {
      double mx = 0;
      for (int32_t s = 0; s < g.labels(i); ++s)
        if (!is_infeasible(g.costs(i)[s])) mx = std::max(mx, std::abs(g.costs(i)[s]));
      total += mx;
    }
    for (int64_t e = 0; e < g.num_edges(); ++e) {
      const Cost* m = g.edge_matrix(e);
      double mx = 0;
      for (int64_t k = 0, K = int64_t(g.labels(g.edge_a[e])) * g.labels(g.edge_b[e]); k < K; ++k)
        if (!is_infeasible(m[k])) mx = std::max(mx, std::abs(m[k]));
      total += mx;
    }
    masked_cost_ = 4 * total + 1;
    keep_.assign(g.num_nodes, 0);
    for (int32_t i = 0; i < g.num_nodes; ++i) {
      const int64_t* u = bud_.usage.data() + g.label_offset[i];
      keep_[i] = *std::min_element(u, u + g.labels(i)) != *std::max_element(u, u + g.labels(i));
    }
  }

  BudgetBranchOutcome run(const std::vector<int32_t>& incumbent, Cost incumbent_cost);

 private:
  const GraphView& g_;
  const GraphView::Budget& bud_;
  const BudgetBranchConfig& cfg_;
  Trws trws_;
  MemoryProfile memory_;
  PlanState state_;
  std::vector<uint8_t> allowed_;
  std::vector<Cost> unary_;
  std::vector<int32_t> labeling_;
  int64_t one_sweep_ = 0;
  int64_t work_ = 0;
  double mu_unit_ = 1.0;
  Cost masked_cost_ = 0;  // the unary of an excluded label
  std::vector<int32_t> best_;
  Cost best_cost_ = kInf;
  bool improved_ = false;  // best_ holds a plan found here

  int64_t work() const { return work_ + state_.work(); }
  bool out_of_budget() const {
    return Clock::now() >= cfg_.deadline || (cfg_.work_limit > 0 && work() >= cfg_.work_limit);
  }
  Cost total(Cost c) const { return std::abs(c + cfg_.cost_offset); }
  // How far below the best plan a bound must stay for a node to be worth opening: a proof
  // (a quarter unit with integer costs, where a better plan is a whole unit cheaper;
  // floating-point noise otherwise) or the gap tolerance.
  Cost proof_margin() const { return cfg_.integer_costs ? kIntegerProofGap : 1e-9 * std::max(1.0, total(best_cost_)); }
  Cost margin() const {
    return std::isfinite(best_cost_) ? std::max(proof_margin(), cfg_.gap_tolerance * total(best_cost_)) : 0.0;
  }
  double offset(double mu) const { return mu > 0 ? mu * double(bud_.high) : mu * double(bud_.low); }
  int side(const Point& p) const { return p.usage > bud_.high ? 1 : p.usage < bud_.low ? -1 : 0; }

  bool restrict_to(const std::vector<Fix>& fixes);
  Cost knapsack_bound(Cost rest, double mu);
  std::vector<uint8_t> keep_;  // budget nodes: held out of TRW-S's bound for the knapsack
  std::vector<Cost> terms_, dp_, next_dp_;
  std::vector<int32_t> kept_;
  std::vector<std::vector<std::pair<int64_t, Cost>>> items_;
  Point solve_at(double mu, Cost cutoff);
  void offer(const Point& p);
  struct NodeResult {
    Cost bound = -kInf;
    double mu = 0;
    bool infeasible = false;
    bool bracketed = false;
    Point over, under;          // plans on either side of the best multiplier (when bracketed)
    std::vector<int32_t> plan;  // the decoded plan of the last multiplier tried
  };
  int32_t least_decided(const std::vector<int32_t>& plan) const;
  NodeResult evaluate(double mu_hint, Cost cutoff);
};

bool Brancher::restrict_to(const std::vector<Fix>& fixes) {
  std::fill(allowed_.begin(), allowed_.end(), 1);
  for (const Fix& f : fixes) {
    const int64_t off = g_.label_offset[f.node];
    for (int32_t s = 0; s < g_.labels(f.node); ++s) {
      const int64_t u = bud_.usage[off + s];
      if (u < f.lo || u > f.hi || (f.label >= 0 && (s == f.label) == f.exclude)) allowed_[off + s] = 0;
    }
  }
  int64_t lo = 0, hi = 0;
  for (int32_t i = 0; i < g_.num_nodes; ++i) {
    int64_t mn = std::numeric_limits<int64_t>::max(), mx = std::numeric_limits<int64_t>::min();
    const int64_t off = g_.label_offset[i];
    for (int32_t s = 0; s < g_.labels(i); ++s)
      if (allowed_[off + s] && !is_infeasible(g_.node_cost[off + s])) {
        mn = std::min(mn, bud_.usage[off + s]);
        mx = std::max(mx, bud_.usage[off + s]);
      }
    if (mn > mx) return false;
    lo += mn;
    hi += mx;
  }
  return lo <= bud_.high && hi >= bud_.low;
}

Point Brancher::solve_at(double mu, Cost cutoff) {
  Point p;
  p.mu = mu;
  const double off = offset(mu);
  for (size_t k = 0; k < unary_.size(); ++k)
    unary_[k] = allowed_[k] ? g_.node_cost[k] + mu * double(bud_.usage[k]) : masked_cost_;
  trws_.set_unary(unary_);
  Cost previous = -kInf;
  int flat = 0;
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    trws_.iterate(labeling_);
    work_ += one_sweep_;
    Cost value = 0;
    int64_t usage = 0;
    for (int32_t i = 0; i < g_.num_nodes && value < kInf; ++i) {
      const int64_t k = g_.label_offset[i] + labeling_[i];
      if (!allowed_[k]) value = kInf;
      usage += bud_.usage[k];
    }
    if (value < kInf) value = graph_cost(g_, labeling_);
    if (is_infeasible(value)) value = kInf;
    const Cost pen = value + mu * double(usage) - off;
    if (pen < p.penalised) {
      p.penalised = pen;
      p.x = labeling_;
      p.value = value;
      p.usage = usage;
    }
    if (sweep % 2 == 0 && sweep + 1 < kMaxSweeps) continue;  // bound every other sweep
    // TRW-S's bound with the budget nodes held out, then minimised under the budget.
    const Cost rest = trws_.lower_bound_keeping(keep_, terms_, kept_);
    work_ += one_sweep_;
    Cost lb = rest - off;
    for (int32_t k : kept_) {
      Cost mn = kInf;
      for (int32_t s2 = 0; s2 < g_.labels(k); ++s2)
        if (allowed_[g_.label_offset[k] + s2]) mn = std::min(mn, terms_[g_.label_offset[k] + s2]);
      lb += mn;
    }
    lb = std::max(lb, knapsack_bound(rest, mu));
    p.bound = std::max(p.bound, lb);
    if (p.penalised - p.bound <= 1e-9 * std::max(1.0, std::abs(p.bound))) break;  // solved exactly
    if (p.bound >= cutoff || out_of_budget()) break;
    // Settled: the bound has not moved for a few checks.
    if (lb <= previous + 1e-7 * std::max(1.0, std::abs(lb))) {
      if (++flat >= kFlatChecks) break;
    } else {
      flat = 0;
      previous = lb;
    }
  }
  return p;
}

// Most budget steps the knapsack dynamic programme keeps (usages are rounded to fewer steps,
// which only loosens its bound).
constexpr int64_t kMaxKnapsackSteps = 20000;

// The penalised problem's bound with the budget kept exact. TRW-S's bound holds the budget
// nodes out (they come last in the order, so everything else is minimised into them): every
// plan x has f(x) + mu * usage(x) >= rest + sum over kept nodes of terms(x_i). For x within
// the budget, mu * usage of the other nodes is at most mu * (high - usage of the kept ones)
// (for mu >= 0; with low for mu < 0), so f(x) >= rest - offset(mu) + sum of terms(x_i), the
// sum minimised over the kept nodes' labels whose usage fits what the others leave: a
// knapsack, solved by a dynamic programme over the extra usage. Never below the plain
// Lagrangian bound (each term minimised alone), and it closes the knapsack gap that the
// multiplier alone leaves. -infinity when it cannot be given.
Cost Brancher::knapsack_bound(Cost rest, double mu) {
  const Cost big = kInfeasibleCost / 16;  // terms this large belong to infeasible choices only
  Cost fixed = rest - offset(mu);
  int64_t kept_min = 0, other_min = 0, other_max = 0, gcd = 0, extra_max = 0;
  std::vector<uint8_t> is_kept(g_.num_nodes, 0);
  for (int32_t i : kept_) is_kept[i] = 1;
  for (int32_t i = 0; i < g_.num_nodes; ++i) {
    if (is_kept[i]) continue;
    const int64_t off = g_.label_offset[i];
    int64_t mn = std::numeric_limits<int64_t>::max(), mx = std::numeric_limits<int64_t>::min();
    for (int32_t s = 0; s < g_.labels(i); ++s)
      if (allowed_[off + s]) {
        mn = std::min(mn, bud_.usage[off + s]);
        mx = std::max(mx, bud_.usage[off + s]);
      }
    if (mn > mx) return -kInf;
    other_min += mn;
    other_max += mx;
  }
  items_.clear();
  for (int32_t i : kept_) {
    const int64_t off = g_.label_offset[i];
    int64_t umin = std::numeric_limits<int64_t>::max(), umax = std::numeric_limits<int64_t>::min();
    for (int32_t s = 0; s < g_.labels(i); ++s)
      if (allowed_[off + s] && terms_[off + s] < big) {
        umin = std::min(umin, bud_.usage[off + s]);
        umax = std::max(umax, bud_.usage[off + s]);
      }
    if (umin > umax) return -kInf;
    kept_min += umin;
    std::vector<std::pair<int64_t, Cost>> opts;
    for (int32_t s = 0; s < g_.labels(i); ++s) {
      if (!allowed_[off + s] || !(terms_[off + s] < big)) continue;
      const int64_t e = bud_.usage[off + s] - umin;
      auto it = std::find_if(opts.begin(), opts.end(), [&](const auto& o) { return o.first == e; });
      if (it == opts.end())
        opts.push_back({e, terms_[off + s]});
      else
        it->second = std::min(it->second, terms_[off + s]);
      gcd = std::gcd(gcd, e);
    }
    if (opts.size() == 1) {
      fixed += opts[0].second;
      continue;
    }
    extra_max += umax - umin;
    items_.push_back(std::move(opts));
  }
  const bool has_high = bud_.high < std::numeric_limits<int64_t>::max();
  const int64_t room = has_high ? bud_.high - other_min - kept_min : extra_max;
  if (room < 0) return kInf;  // nothing fits: no plan within the budget here
  const int64_t need = bud_.low - other_max - kept_min;
  if (items_.empty()) return need > 0 ? kInf : fixed;
  const int64_t slack = std::min(room, extra_max);
  // Steps of the programme: the extras' common divisor, or coarser (rounding each extra down
  // keeps every plan within `high` inside the capacity; `low` is then not enforced).
  int64_t step = std::max<int64_t>(1, gcd);
  bool exact = true;
  if (slack / step > kMaxKnapsackSteps) {
    if (!has_high) return -kInf;
    step = (slack + kMaxKnapsackSteps - 1) / kMaxKnapsackSteps;
    exact = false;
  }
  const int64_t cap = slack / step;
  dp_.assign(cap + 1, kInf);
  dp_[0] = 0;
  int64_t reach = 0;
  for (const auto& opts : items_) {
    next_dp_.assign(cap + 1, kInf);
    int64_t widest = 0;
    for (const auto& o : opts) widest = std::max(widest, o.first / step);
    for (int64_t b = 0; b <= reach; ++b) {
      if (dp_[b] >= kInf) continue;
      for (const auto& o : opts) {
        const int64_t nb = b + o.first / step;
        if (nb <= cap) next_dp_[nb] = std::min(next_dp_[nb], dp_[b] + o.second);
      }
    }
    work_ += (reach + 1) * int64_t(opts.size());
    reach = std::min(cap, reach + widest);
    dp_.swap(next_dp_);
  }
  const int64_t from = exact && need > 0 ? (need + step - 1) / step : 0;
  Cost best = kInf;
  for (int64_t b = from; b <= cap; ++b) best = std::min(best, dp_[b]);
  return fixed + best;
}

// A plan within the budget: polished by single-node descent, kept when the best so far.
void Brancher::offer(const Point& p) {
  if (p.value >= kInf || side(p) != 0) return;
  state_.reset(p.x);
  if (!state_.valid()) return;
  state_.descend(cfg_.deadline);
  if (!state_.valid()) return;
  const Cost c = graph_cost(g_, state_.labels());
  if (c < best_cost_) {
    best_cost_ = c;
    best_ = state_.labels();
    improved_ = true;
  }
}

// Among nodes with two or more allowed labels, the one whose TRW-S min-marginal estimates
// (belief) of its two best allowed labels lie closest (ties: the lowest node); -1 if none.
int32_t Brancher::least_decided(const std::vector<int32_t>& plan) const {
  if (plan.empty()) return -1;
  int32_t pick = -1;
  Cost pick_gap = kInf;
  std::vector<Cost> belief;
  for (int32_t i = 0; i < g_.num_nodes; ++i) {
    const int64_t off = g_.label_offset[i];
    trws_.belief(i, belief);
    Cost first = kInf, second = kInf;
    for (int32_t s = 0; s < g_.labels(i); ++s) {
      if (!allowed_[off + s] || is_infeasible(g_.node_cost[off + s])) continue;
      if (belief[s] < first) {
        second = first;
        first = belief[s];
      } else if (belief[s] < second)
        second = belief[s];
    }
    if (second < kInf && second - first < pick_gap) {
      pick_gap = second - first;
      pick = i;
    }
  }
  return pick;
}

// The Lagrangian dual of the restricted problem, maximised over the multiplier from mu_hint.
// Stops early once the bound reaches `cutoff` (the node is pruned anyway).
Brancher::NodeResult Brancher::evaluate(double mu_hint, Cost cutoff) {
  NodeResult r;
  auto consider = [&](const Point& p) {
    offer(p);
    r.plan = p.x;
    if (p.bound > r.bound) {
      r.bound = p.bound;
      r.mu = p.mu;
    }
  };
  Point p0 = solve_at(mu_hint, cutoff);
  consider(p0);

  if (r.bound >= cutoff || out_of_budget()) return r;
  int s0 = side(p0);
  if (s0 == 0) {
    // Within the budget. With mu on a bound's side and that bound not met exactly, the dual
    // may still rise toward mu = 0; at mu = 0 (or on the bound) it is at its maximum.
    const bool slack = (mu_hint > 0 && p0.usage != bud_.high) || (mu_hint < 0 && p0.usage != bud_.low);
    if (!slack) return r;
    Point z = solve_at(0.0, cutoff);
    consider(z);
    if (r.bound >= cutoff || side(z) == 0 || out_of_budget()) return r;
    (side(z) > 0 ? r.over : r.under) = std::move(z);
    (mu_hint > 0 ? r.under : r.over) = std::move(p0);
    if (r.over.x.empty() || r.under.x.empty()) return r;
  } else {
    // Step the multiplier in the direction of the violation, doubling, until the plan is back
    // within the budget (or past it on the other side).
    double step = std::max(mu_unit_, 0.5 * std::abs(mu_hint));
    Point cur = std::move(p0);
    for (int k = 0; k < 60; ++k) {
      Point next = solve_at(cur.mu + s0 * step, cutoff);
      consider(next);
      if (r.bound >= cutoff || out_of_budget()) return r;
      const int s = side(next);
      if (s != s0) {
        (s0 > 0 ? r.over : r.under) = std::move(cur);
        (s0 > 0 ? r.under : r.over) = std::move(next);
        break;
      }
      cur = std::move(next);
      step *= 2;
    }
    if (r.over.x.empty() || r.under.x.empty()) return r;
  }
  r.bracketed = true;
  // Cutting planes: each plan's penalised cost is a line in mu above the dual; the next
  // multiplier is where the two bracketing lines cross. Lines cross 0 only through a kink of
  // the multiplier term, so a bracket around 0 is split at 0 first.
  for (int it = 0; it < kMaxPoints; ++it) {
    const Point& a = r.over;   // usage above high (or above low, on the low side)
    const Point& b = r.under;  // usage below
    double mu;
    if (a.mu < 0 && b.mu > 0) {
      mu = 0.0;
    } else {
      const bool high_side = std::max(a.mu, b.mu) > 0;
      const double bound_usage = double(high_side ? bud_.high : bud_.low);
      const double da = double(a.usage) - bound_usage, db = double(b.usage) - bound_usage;
      if (!(da > db) || a.value >= kInf || b.value >= kInf) break;
      mu = (b.value - a.value) / (da - db);
      const double lo = std::min(a.mu, b.mu), hi = std::max(a.mu, b.mu);
      if (!(mu > lo && mu < hi)) break;
      // The dual never exceeds the lines' crossing: no multiplier in the bracket can do better.
      const Cost crossing = a.value + mu * da;
      if (crossing - r.bound <= 1e-9 * std::max(1.0, std::abs(crossing)) || crossing < r.bound) break;
    }
    Point p = solve_at(mu, cutoff);
    consider(p);
    if (r.bound >= cutoff || out_of_budget()) break;
    const int s = side(p);
    if (s > 0)
      r.over = std::move(p);
    else if (s < 0)
      r.under = std::move(p);
    else if ((mu > 0 && p.usage == bud_.high) || (mu < 0 && p.usage == bud_.low) || mu == 0)
      break;
    else
      (mu > 0 ? r.under : r.over) = std::move(p);  // within, with slack: the dual rises toward 0
  }
  return r;
}

BudgetBranchOutcome Brancher::run(const std::vector<int32_t>& incumbent, Cost incumbent_cost) {
  BudgetBranchOutcome out;
  if (!incumbent.empty()) {
    best_ = incumbent;
    best_cost_ = incumbent_cost;
  }
  std::priority_queue<Open, std::vector<Open>, WorseFirst> open;
  int64_t next_id = 0;
  open.push(Open{-kInf, next_id++, 0.0, {}});
  Cost closed_bound = kInf;  // smallest bound of a node closed without a proof
  bool stuck = false;        // a node whose bound no budget branching can raise
  out.stopped_by = "complete";
  while (!open.empty()) {
    const Cost frontier = std::min(open.top().bound, closed_bound);
    if (std::isfinite(best_cost_) && best_cost_ - frontier <= margin()) {
      out.stopped_by = best_cost_ - frontier <= proof_margin() ? "complete" : "gap tolerance";
      break;
    }
    if (out_of_budget()) {
      out.stopped_by = Clock::now() >= cfg_.deadline ? "time limit" : "work limit";
      break;
    }
    Open node = open.top();
    open.pop();
    if (std::isfinite(best_cost_) && node.bound >= best_cost_ - margin()) {  // pruned by a later plan
      if (node.bound < best_cost_ - proof_margin()) closed_bound = std::min(closed_bound, node.bound);
      continue;
    }
    ++out.nodes;
    if (!restrict_to(node.fixes)) continue;  // no plan within the budget under these fixes
    const Cost cutoff = std::isfinite(best_cost_) ? best_cost_ - margin() : kInf;
    NodeResult r = evaluate(node.mu, cutoff);
    const Cost bound = std::max(node.bound, r.bound);
    if (cfg_.verbose)
      std::fprintf(stderr, "[budget b&b] node %lld depth %zu bound %.9g mu %.4g best %.9g open %zu\n",
                   (long long)out.nodes, node.fixes.size(), bound + cfg_.cost_offset, r.mu,
                   best_cost_ + cfg_.cost_offset, open.size());
    const Cost cut = std::isfinite(best_cost_) ? best_cost_ - margin() : kInf;
    if (bound >= cut) {
      if (bound < best_cost_ - proof_margin()) closed_bound = std::min(closed_bound, bound);
      continue;
    }
    if (out_of_budget()) {  // evaluation cut short: the node stays open at its bound
      open.push(Open{bound, node.id, r.mu, std::move(node.fixes)});
      continue;
    }
    // Branch on the budget node whose usage differs most between the plans on either side
    // of the best multiplier (ties: the lowest node).
    int32_t pick = -1;
    int64_t pick_diff = 0;
    if (r.bracketed)
      for (int32_t i = 0; i < g_.num_nodes; ++i) {
        const int64_t ua = bud_.usage[g_.label_offset[i] + r.over.x[i]],
                      ub = bud_.usage[g_.label_offset[i] + r.under.x[i]];
        const int64_t d = ua > ub ? ua - ub : ub - ua;
        if (d > pick_diff) {
          pick_diff = d;
          pick = i;
        }
      }
    if (pick < 0) {
      // The multiplier is at its best with the plan within the budget: the gap left is TRW-S's
      // (its relaxation is not tight here). Branch on the node whose relaxed choice is least
      // clear: the smallest difference between its two best labels' min-marginals.
      const int32_t node_pick = least_decided(r.plan);
      if (node_pick < 0) {  // every node is decided: nothing raises this bound
        stuck = true;
        closed_bound = std::min(closed_bound, bound);
        continue;
      }
      const int32_t label = r.plan[node_pick];
      std::vector<Fix> take = node.fixes, avoid = std::move(node.fixes);
      take.push_back({node_pick, kAnyLo, kAnyHi, label, false});
      avoid.push_back({node_pick, kAnyLo, kAnyHi, label, true});
      open.push(Open{bound, next_id++, r.mu, std::move(take)});
      open.push(Open{bound, next_id++, r.mu, std::move(avoid)});
      continue;
    }
    const int64_t ua = bud_.usage[g_.label_offset[pick] + r.over.x[pick]];
    const int64_t ub = bud_.usage[g_.label_offset[pick] + r.under.x[pick]];
    const int64_t t = std::min(ua, ub);
    std::vector<Fix> low_side = node.fixes, high_side = std::move(node.fixes);
    low_side.push_back({pick, kAnyLo, t});
    high_side.push_back({pick, t + 1, kAnyHi});
    open.push(Open{bound, next_id++, r.mu, std::move(low_side)});
    open.push(Open{bound, next_id++, r.mu, std::move(high_side)});
  }
  Cost frontier = closed_bound;
  if (!open.empty()) frontier = std::min(frontier, open.top().bound);
  if (std::isfinite(best_cost_)) frontier = std::min(frontier, best_cost_);
  out.lower_bound = frontier;
  // Complete: every node closed by a proof (none left open, none closed on the gap tolerance
  // or stuck on TRW-S's bound), or the bound meets the plan anyway.
  out.complete = (open.empty() && closed_bound == kInf && !stuck) ||
                 (std::isfinite(best_cost_) && best_cost_ - frontier <= proof_margin());
  if (out.complete)
    out.stopped_by = "complete";
  else if (open.empty())
    out.stopped_by = stuck ? "bound" : "gap tolerance";
  if (improved_) {
    out.best = best_;
    out.best_cost = best_cost_;
  }
  out.work = work();
  return out;
}

}  // namespace

BudgetBranchOutcome budget_branch(const GraphView& g, int32_t budget, const std::vector<int32_t>& incumbent,
                                  Cost incumbent_cost, const BudgetBranchConfig& config) {
  Brancher b(g, budget, config);
  return b.run(incumbent, incumbent_cost);
}

namespace {

// The problem with its nodes in `order` (new node k is old node order[k]).
Problem permuted(const Problem& p, const std::vector<int32_t>& order) {
  std::vector<int32_t> where(order.size());
  for (size_t k = 0; k < order.size(); ++k) where[order[k]] = static_cast<int32_t>(k);
  Problem q;
  q.name = p.name;
  q.usage_limit = p.usage_limit;
  for (int32_t i : order) {
    q.node_costs.push_back(p.node_costs[i]);
    q.node_usages.push_back(size_t(i) < p.node_usages.size() ? p.node_usages[i] : std::vector<int64_t>{});
    q.intervals.push_back(size_t(i) < p.intervals.size() ? p.intervals[i] : Interval{});
    if (!p.node_names.empty()) q.node_names.push_back(p.node_names[i]);
  }
  for (const Edge& e : p.edges) q.edges.push_back({where[e.u], where[e.v], e.costs});
  for (const GlobalBudget& b : p.budgets) {
    GlobalBudget nb = b;
    nb.usage.assign(order.size(), {});
    for (size_t k = 0; k < order.size(); ++k)
      if (size_t(order[k]) < b.usage.size()) nb.usage[k] = b.usage[order[k]];
    q.budgets.push_back(std::move(nb));
  }
  return q;
}

}  // namespace

bool solve_budget_branch(const Problem& problem, const SolveOptions& options, const Solution* warm_start,
                         SolveResult& result) {
  const auto t0 = Clock::now();
  const Reduction red = reduce(problem);
  if (red.infeasible) return false;  // the heuristic has said so already
  {
    const GraphView probe = build_referencing_view(red.reduced);
    if (branching_budget(probe, red.reduced.usage_limit) < 0) return false;
  }
  // The nodes whose budget usage varies go last: TRW-S's bound then minimises everything
  // else into them, and the knapsack over them sees the budget whole (knapsack_bound).
  std::vector<int32_t> order;
  {
    const int32_t n = static_cast<int32_t>(red.reduced.num_nodes());
    std::vector<uint8_t> varies(n, 0);
    for (const GlobalBudget& b : red.reduced.budgets)
      for (int32_t i = 0; i < n && size_t(i) < b.usage.size(); ++i)
        if (!b.usage[i].empty() && *std::min_element(b.usage[i].begin(), b.usage[i].end()) !=
                                       *std::max_element(b.usage[i].begin(), b.usage[i].end()))
          varies[i] = 1;
    for (int pass = 0; pass < 2; ++pass)
      for (int32_t i = 0; i < n; ++i)
        if (varies[i] == pass) order.push_back(i);
  }
  const Problem ordered = permuted(red.reduced, order);
  const GraphView g = build_referencing_view(ordered);  // `ordered` outlives it
  const int32_t budget = branching_budget(g, ordered.usage_limit);
  if (budget < 0) return false;
  // The warm start maps onto the reduced problem when every choice survived the reductions.
  std::vector<int32_t> incumbent;
  Cost incumbent_cost = 0;
  if (warm_start && warm_start->size() == problem.num_nodes()) {
    incumbent.assign(g.num_nodes, -1);
    for (int32_t k = 0; k < g.num_nodes; ++k) {
      const int32_t i = order[k];
      const auto& strat = red.original_strategy[i];
      for (size_t s = 0; s < strat.size(); ++s)
        if (strat[s] == (*warm_start)[red.original_node[i]]) incumbent[k] = static_cast<int32_t>(s);
    }
    MemoryProfile memory(g, -1);
    PlanState state(g, memory);
    if (std::find(incumbent.begin(), incumbent.end(), -1) == incumbent.end()) state.reset(incumbent);
    if (std::find(incumbent.begin(), incumbent.end(), -1) != incumbent.end() || !state.valid())
      incumbent.clear();
    else
      incumbent_cost = graph_cost(g, incumbent);
  }
  BudgetBranchConfig config;
  config.deadline = t0 + from_seconds(std::clamp(options.time_limit_s, 0.0, kMaxTimeLimitS));
  config.work_limit = options.work_limit;
  config.gap_tolerance = options.gap_tolerance;
  config.integer_costs = has_integer_costs(ordered) && std::nearbyint(red.cost_offset) == red.cost_offset;
  config.cost_offset = red.cost_offset;
  config.verbose = options.verbose;
  const BudgetBranchOutcome out = budget_branch(g, budget, incumbent, incumbent_cost, config);
  if (options.verbose)
    std::fprintf(stderr, "[budget b&b] %lld nodes, stopped by %s: bound %.9g, best %.9g, %.3f s\n",
                 (long long)out.nodes, out.stopped_by, out.lower_bound + red.cost_offset,
                 (out.best.empty() ? incumbent_cost : out.best_cost) + red.cost_offset, seconds_since(t0));
  result = SolveResult{};
  result.lower_bound = out.lower_bound + red.cost_offset;
  result.work = out.work;
  if (!out.best.empty()) {
    result.found = true;
    Solution reduced(out.best.size());
    for (size_t k = 0; k < out.best.size(); ++k) reduced[order[k]] = out.best[k];
    result.solution = red.expand(reduced);
    result.cost = out.best_cost + red.cost_offset;
    result.time_to_first_s = seconds_since(t0);
  }
  result.proven_optimal = out.complete && (result.found || !incumbent.empty());
  result.status = out.complete
                      ? (result.found || !incumbent.empty() ? "optimal" : "infeasible (proven by branch and bound)")
                  : std::string(out.stopped_by) == "gap tolerance" ? "gap tolerance"
                  : std::string(out.stopped_by) == "work limit"    ? "work limit"
                                                                   : "time limit";
  result.total_time_s = seconds_since(t0);
  return true;
}

}  // namespace autoshard::detail
