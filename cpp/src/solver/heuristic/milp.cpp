#include "heuristic/milp.h"

#include "autoshard/clock.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "Highs.h"

namespace autoshard::detail {

namespace {

// Caps on the model: beyond them the LP relaxation alone can take minutes, and the time is
// better spent in the heuristic.
constexpr int32_t kMaxNodes = 6000;
constexpr int64_t kMaxMatrixEntries = 4'000'000;  // checked before building
constexpr int64_t kMaxColumns = 1'500'000;
constexpr int64_t kMaxNonzeros = 12'000'000;

bool finite(Cost c) { return c < kInfeasibleCost; }

// The model in HiGHS's row-wise form, with x's column per (node, strategy) (-1 when the
// strategy's cost is infeasible) and each y column's edge entry, to write a start from a plan.
// Every column lies in [0, 1].
struct Model {
  std::vector<double> cost;
  std::vector<double> row_lo, row_hi;
  std::vector<HighsInt> start{0}, index;
  std::vector<double> value;
  std::vector<std::vector<int32_t>> x_col;  // [node][strategy]
  int64_t num_x = 0;
  struct YBlock {
    int32_t edge = 0;
    std::vector<int32_t> col;  // [a * |S_b| + b], -1 where no column
  };
  std::vector<YBlock> y;
  bool too_big = false;

  int32_t add_column(double c) {
    cost.push_back(c);
    return static_cast<int32_t>(cost.size() - 1);
  }
  void add_row(double lo, double hi) {
    row_lo.push_back(lo);
    row_hi.push_back(hi);
    start.push_back(static_cast<HighsInt>(index.size()));
    if (static_cast<int64_t>(index.size()) > kMaxNonzeros) too_big = true;
  }
  void term(int32_t col, double v) {
    index.push_back(col);
    value.push_back(v);
  }
};

// Whether m (|S_a| x |S_b|, restricted to the strategies with columns) is a row term plus a
// column term, exactly in doubles; then r and c hold them.
bool additive(const GraphView& g, int32_t e, const Model& md, std::vector<double>& r, std::vector<double>& c) {
  const int32_t a = g.edge_a[e], b = g.edge_b[e], sb = g.labels(b);
  const Cost* m = g.edge_matrix(e);
  int32_t a0 = -1, b0 = -1;
  for (int32_t s = 0; s < g.labels(a) && a0 < 0; ++s)
    if (md.x_col[a][s] >= 0) a0 = s;
  for (int32_t s = 0; s < sb && b0 < 0; ++s)
    if (md.x_col[b][s] >= 0) b0 = s;
  if (a0 < 0 || b0 < 0) return false;
  r.assign(g.labels(a), 0.0);
  c.assign(sb, 0.0);
  const Cost corner = m[int64_t(a0) * sb + b0];
  if (!finite(corner)) return false;
  for (int32_t t = 0; t < sb; ++t) c[t] = m[int64_t(a0) * sb + t];
  for (int32_t s = 0; s < g.labels(a); ++s) {
    if (md.x_col[a][s] < 0) continue;
    r[s] = m[int64_t(s) * sb + b0] - corner;
    for (int32_t t = 0; t < sb; ++t) {
      if (md.x_col[b][t] < 0) continue;
      const Cost v = m[int64_t(s) * sb + t];
      if (!finite(v) || v != r[s] + c[t]) return false;
    }
  }
  return true;
}

// Times at which the set of live nodes is maximal: a start not followed by another start
// before the next end. Every other time's live set is contained in one of these, and usages
// are >= 0, so their rows imply all the others.
std::vector<int64_t> maximal_live_times(const GraphView& g) {
  std::vector<int64_t> starts, ends;
  for (const Interval& iv : g.interval)
    if (iv.end > iv.start) {
      starts.push_back(iv.start);
      ends.push_back(iv.end);
    }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::sort(ends.begin(), ends.end());
  std::vector<int64_t> times;
  for (size_t k = 0; k < starts.size(); ++k) {
    const int64_t t = starts[k];
    const auto next_end = std::upper_bound(ends.begin(), ends.end(), t);
    if (k + 1 < starts.size() && next_end != ends.end() && *next_end > starts[k + 1]) continue;
    times.push_back(t);
  }
  return times;
}

// Marks the strategies that get a column (x_col 0, else -1), before any column exists.
void mark_allowed(const GraphView& g, Model& md) {
  md.x_col.resize(g.num_nodes);
  for (int32_t i = 0; i < g.num_nodes; ++i) {
    md.x_col[i].assign(g.labels(i), -1);
    for (int32_t s = 0; s < g.labels(i); ++s)
      if (finite(g.costs(i)[s])) md.x_col[i][s] = 0;
  }
}

// The columns: x per allowed strategy (its cost with the additive edges folded in), then y per
// finite entry of every other edge. No rows yet.
void add_columns(const GraphView& g, Model& md) {
  mark_allowed(g, md);
  std::vector<double> node_cost(g.node_cost.begin(), g.node_cost.end());
  std::vector<char> folded(g.num_edges(), 0);
  std::vector<double> r, c;
  for (int32_t e = 0; e < g.num_edges(); ++e) {
    if (!additive(g, e, md, r, c)) continue;
    folded[e] = 1;
    const int32_t a = g.edge_a[e], b = g.edge_b[e];
    for (int32_t s = 0; s < g.labels(a); ++s) node_cost[g.label_offset[a] + s] += r[s];
    for (int32_t t = 0; t < g.labels(b); ++t) node_cost[g.label_offset[b] + t] += c[t];
  }
  for (int32_t i = 0; i < g.num_nodes; ++i)
    for (int32_t s = 0; s < g.labels(i); ++s)
      if (md.x_col[i][s] == 0) md.x_col[i][s] = md.add_column(node_cost[g.label_offset[i] + s]);
  md.num_x = static_cast<int64_t>(md.cost.size());
  for (int32_t e = 0; e < g.num_edges(); ++e) {
    if (folded[e]) continue;
    const int32_t a = g.edge_a[e], b = g.edge_b[e], sa = g.labels(a), sb = g.labels(b);
    const Cost* m = g.edge_matrix(e);
    Model::YBlock blk;
    blk.edge = e;
    blk.col.assign(int64_t(sa) * sb, -1);
    for (int32_t s = 0; s < sa; ++s)
      for (int32_t t = 0; t < sb; ++t)
        if (md.x_col[a][s] >= 0 && md.x_col[b][t] >= 0 && finite(m[int64_t(s) * sb + t]))
          blk.col[int64_t(s) * sb + t] = md.add_column(m[int64_t(s) * sb + t]);
    md.y.push_back(std::move(blk));
    if (static_cast<int64_t>(md.cost.size()) > kMaxColumns) {
      md.too_big = true;
      return;
    }
  }
}

// One edge's marginal rows on one side: for each allowed strategy s of `node`, the block's
// entries in s's row (stride_own) sum to x[node, s]; `other` strategies at stride_other.
void add_marginal_rows(Model& md, const Model::YBlock& blk, int32_t node, int32_t other, int64_t stride_own,
                       int64_t stride_other) {
  for (int32_t s = 0; s < static_cast<int32_t>(md.x_col[node].size()); ++s) {
    if (md.x_col[node][s] < 0) continue;
    md.term(md.x_col[node][s], -1.0);
    for (int32_t t = 0; t < other; ++t) {
      const int32_t col = blk.col[s * stride_own + t * stride_other];
      if (col >= 0) md.term(col, 1.0);
    }
    md.add_row(0.0, 0.0);
  }
}

Model build(const GraphView& g, int64_t usage_limit) {
  Model md;
  const int32_t n = g.num_nodes;
  add_columns(g, md);
  if (md.too_big) return md;
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t col : md.x_col[i])
      if (col >= 0) md.term(col, 1.0);
    md.add_row(1.0, 1.0);
  }
  for (const Model::YBlock& blk : md.y) {
    if (md.too_big) break;
    const int32_t a = g.edge_a[blk.edge], b = g.edge_b[blk.edge], sa = g.labels(a), sb = g.labels(b);
    add_marginal_rows(md, blk, a, sb, sb, 1);
    add_marginal_rows(md, blk, b, sa, 1, sb);
  }

  if (usage_limit >= 0) {
    std::vector<int64_t> least(n, 0);
    for (int32_t i = 0; i < n; ++i) {
      int64_t lo = std::numeric_limits<int64_t>::max();
      for (int32_t s = 0; s < g.labels(i); ++s)
        if (md.x_col[i][s] >= 0) lo = std::min(lo, g.usages(i)[s]);
      least[i] = lo == std::numeric_limits<int64_t>::max() ? 0 : lo;
    }
    for (int64_t t : maximal_live_times(g)) {
      if (md.too_big) break;
      double cap = static_cast<double>(usage_limit);
      bool any = false;
      for (int32_t i = 0; i < n; ++i) {
        if (!(g.interval[i].start <= t && t < g.interval[i].end)) continue;
        cap -= static_cast<double>(least[i]);
        for (int32_t s = 0; s < g.labels(i); ++s) {
          if (md.x_col[i][s] < 0 || g.usages(i)[s] <= least[i]) continue;
          md.term(md.x_col[i][s], static_cast<double>(g.usages(i)[s] - least[i]));
          any = true;
        }
      }
      if (any || cap < 0) md.add_row(-kHighsInf, cap);
    }
  }
  for (size_t k = 0; k < g.budgets.size() && !md.too_big; ++k) {
    if (!budget_can_bind(g, k)) continue;
    for (int32_t i = 0; i < n; ++i)
      for (int32_t s = 0; s < g.labels(i); ++s)
        if (md.x_col[i][s] >= 0 && g.budgets[k].usage[g.label_offset[i] + s] != 0)
          md.term(md.x_col[i][s], static_cast<double>(g.budgets[k].usage[g.label_offset[i] + s]));
    md.add_row(static_cast<double>(g.budgets[k].low), static_cast<double>(g.budgets[k].high));
  }
  return md;
}

}  // namespace

int64_t milp_column_bound(const Problem& p) {
  if (p.num_nodes() > static_cast<size_t>(kMaxNodes)) return -1;
  int64_t columns = 0;
  for (size_t i = 0; i < p.num_nodes(); ++i) columns += static_cast<int64_t>(p.num_strategies(i));
  for (const Edge& e : p.edges) {
    columns += static_cast<int64_t>(e.costs.size());
    if (columns > kMaxMatrixEntries) return -1;
  }
  return columns;
}

int64_t milp_columns(const GraphView& g) {
  Model md;
  add_columns(g, md);
  return static_cast<int64_t>(md.cost.size());
}

SolveResult solve_milp(const GraphView& g, int64_t usage_limit, bool integer_costs, const SolveOptions& o,
                       const Solution* incumbent, const std::atomic<bool>* interrupt) {
  SolveResult out;
  out.lower_bound = -kInfeasibleCost;
  for (int32_t i = 0; i < g.num_nodes; ++i) {
    bool any = false;
    for (int32_t s = 0; s < g.labels(i) && !any; ++s) any = finite(g.costs(i)[s]);
    if (!any) return out;  // no strategy of node i is allowed: no plan (the heuristic says why)
  }
  Model md = build(g, usage_limit);
  if (md.too_big) {
    out.status = "MILP skipped: the model is too large";
    return out;
  }

  HighsLp lp;
  lp.num_col_ = static_cast<HighsInt>(md.cost.size());
  lp.num_row_ = static_cast<HighsInt>(md.row_lo.size());
  lp.col_cost_ = std::move(md.cost);
  lp.col_lower_.assign(lp.num_col_, 0.0);
  lp.col_upper_.assign(lp.num_col_, 1.0);
  lp.row_lower_ = std::move(md.row_lo);
  lp.row_upper_ = std::move(md.row_hi);
  lp.a_matrix_.format_ = MatrixFormat::kRowwise;
  lp.a_matrix_.num_col_ = lp.num_col_;
  lp.a_matrix_.num_row_ = lp.num_row_;
  lp.a_matrix_.start_ = std::move(md.start);
  lp.a_matrix_.index_ = std::move(md.index);
  lp.a_matrix_.value_ = std::move(md.value);
  lp.integrality_.assign(lp.num_col_, HighsVarType::kContinuous);
  for (int64_t k = 0; k < md.num_x; ++k) lp.integrality_[k] = HighsVarType::kInteger;

  Highs h;
  // HiGHS logs to stdout, where `autoshard solve` writes its plan; the dispatcher reports it.
  h.setOptionValue("output_flag", false);
  h.setOptionValue("threads", 1);
  h.setOptionValue("random_seed", static_cast<HighsInt>(o.seed % 2147483647));
  h.setOptionValue("time_limit", std::max(0.01, o.time_limit_s));
  h.setOptionValue("mip_rel_gap", o.gap_tolerance);
  // With integer costs a gap below one unit proves the optimum (see kIntegerProofGap).
  h.setOptionValue("mip_abs_gap", integer_costs ? kIntegerProofGap : 1e-6);
  if (h.passModel(std::move(lp)) != HighsStatus::kOk) return out;
  if (incumbent != nullptr && static_cast<int32_t>(incumbent->size()) == g.num_nodes) {
    HighsSolution start;
    start.col_value.assign(h.getNumCol(), 0.0);
    bool usable = true;
    for (int32_t i = 0; i < g.num_nodes && usable; ++i) {
      const int32_t col = md.x_col[i][(*incumbent)[i]];
      usable = col >= 0;
      if (usable) start.col_value[col] = 1.0;
    }
    for (const Model::YBlock& blk : md.y) {
      if (!usable) break;
      const int32_t a = g.edge_a[blk.edge], b = g.edge_b[blk.edge];
      const int32_t col = blk.col[int64_t((*incumbent)[a]) * g.labels(b) + (*incumbent)[b]];
      usable = col >= 0;
      if (usable) start.col_value[col] = 1.0;
    }
    if (usable) {
      start.value_valid = true;
      h.setSolution(start);
    }
  }
  // HiGHS checks its own time limit less often than it offers interrupt points, so these also
  // look at the clock, and at `interrupt`. Presolve offers none (6 s on 123 k columns of
  // S-sub2000 under load): the caller's size gate keeps it short.
  struct Stop {
    const std::atomic<bool>* flag;
    Clock::time_point deadline;
  } stop{interrupt, Clock::now() + from_seconds(o.time_limit_s)};
  h.setCallback(
      [](int, const std::string&, const HighsCallbackOutput*, HighsCallbackInput* in, void* data) {
        const Stop& st = *static_cast<const Stop*>(data);
        if ((st.flag != nullptr && st.flag->load(std::memory_order_relaxed)) || Clock::now() >= st.deadline)
          in->user_interrupt = true;
      },
      &stop);
  h.startCallback(kCallbackMipInterrupt);
  h.startCallback(kCallbackSimplexInterrupt);
  h.startCallback(kCallbackIpmInterrupt);
  h.run();
  const HighsInfo& info = h.getInfo();
  const HighsModelStatus status = h.getModelStatus();
  if (status == HighsModelStatus::kInfeasible) {
    // Not turned into a bound: within HiGHS's tolerances a plan may still exist, and the
    // heuristic's plans are checked exactly.
    out.status = "MILP: infeasible";
    return out;
  }
  if (std::isfinite(info.mip_dual_bound)) out.lower_bound = info.mip_dual_bound;
  if (info.primal_solution_status == kSolutionStatusFeasible) {
    const std::vector<double>& v = h.getSolution().col_value;
    out.solution.assign(g.num_nodes, 0);
    for (int32_t i = 0; i < g.num_nodes; ++i) {
      double best = -1;
      for (int32_t s = 0; s < g.labels(i); ++s) {
        const int32_t col = md.x_col[i][s];
        if (col >= 0 && v[col] > best) {
          best = v[col];
          out.solution[i] = s;
        }
      }
    }
    out.found = true;
    out.cost = graph_cost(g, out.solution);  // exact, where HiGHS's objective carries its tolerances
  }
  out.status = status == HighsModelStatus::kOptimal ? "optimal (MILP)" : "time limit (MILP)";
  return out;
}

}  // namespace autoshard::detail
