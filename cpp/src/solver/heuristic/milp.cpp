#include "heuristic/milp.h"

#include "autoshard/clock.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "Highs.h"
#include "heuristic/lns_tree.h"
#include "heuristic/local_search.h"
#include "heuristic/memory_profile.h"

namespace autoshard::detail {

namespace {

// Caps on the model: beyond them the LP relaxation alone can take minutes, and the time is
// better spent in the heuristic. Counted on the model over clusters (groups), not nodes.
constexpr int32_t kMaxGroups = 6000;
constexpr int64_t kMaxColumns = 1'500'000;
constexpr int64_t kMaxNonzeros = 12'000'000;
// Memory rows beyond solve_milp's eager_memory_nonzeros are added up to kRowsPerRound at a
// time where the MILP's plan breaks the limit (broken_rows). Contracted, public C has 19,707
// maximal live sets with 3.1 M nonzeros: with every row, HiGHS's presolve alone took 24 s on
// C-perturb, and the solve 70 s. Seconds from the MILP's start to its proof (one thread,
// after the search's 18 s), at 200 / 700 / 1,000 / 2,000 rows a round: public C 35 / 41 / 19
// / 24 s, public A 9 / 10 / 16 / - s, C-perturb 18 / 14 / 15 / - s. HiGHS's branching makes
// these vary by several seconds from run to run; 1,000 has the smallest worst case.
constexpr int32_t kRowsPerRound = 1000;
// The relative gap of the rounds that add memory rows (solve_milp).
constexpr double kRoundGap = 0.01;

// Memory rows go to HiGHS divided by their cap (bytes: up to 2e10 on public C, with
// coefficients up to 3e11), so that it sees numbers near 1: C-perturb's second MILP round
// took 6.8 s instead of 9.0 s. Their activity is still checked in bytes (broken_rows).
double row_scale(double cap) { return cap >= 1 ? cap : 1.0; }

bool finite(Cost c) { return c < kInfeasibleCost; }
Cost add_cost(Cost a, Cost b) { return finite(a) && finite(b) ? a + b : kInfeasibleCost; }

// The problem contracted to its clusters (graph_clusters.h): a cluster's label is its root's
// label, which fixes every member's. Its cost per label sums the members' node costs and the
// edges inside it; edges between two clusters sum into one matrix per cluster pair. The XLA
// graphs tie most nodes into a few hundred clusters (public A: 34,932 nodes, 392 clusters,
// 852 cluster pairs; C: 32,894, 451, 862; P: 65,335, 275, 520), and the LP relaxation over
// clusters is far tighter than over nodes, whose cycles through a cluster's parallel paths it
// cannot rule out: on C-perturb the node-level dual bound stays 7 % below the optimum, the
// contracted LP 0.07 %. Singleton clusters give the per-node model.
struct Contracted {
  struct Block {
    int32_t a = 0, b = 0;  // clusters, a < b
    std::vector<Cost> m;   // labels(a) x labels(b), row-major
  };
  std::vector<int32_t> labels;  // per cluster
  std::vector<int64_t> offset;  // per cluster: its labels' entries in `unary`
  std::vector<Cost> unary;
  std::vector<Block> blocks;
  bool too_big = false;
};

int32_t member_label(const Clusters& cl, int32_t i, int32_t root_label) {
  return cl.label_of_root[cl.map_offset[i] + root_label];
}

Contracted contract(const GraphView& g, const Clusters& cl) {
  Contracted c;
  const int32_t K = cl.num_clusters();
  if (K > kMaxGroups) {
    c.too_big = true;
    return c;
  }
  c.labels.resize(K);
  c.offset.assign(K + 1, 0);
  for (int32_t k = 0; k < K; ++k) {
    c.labels[k] = g.labels(cl.root(k));
    c.offset[k + 1] = c.offset[k] + c.labels[k];
  }
  c.unary.assign(c.offset[K], 0.0);
  for (int32_t i = 0; i < g.num_nodes; ++i) {
    const int32_t k = cl.cluster_of[i];
    for (int32_t r = 0; r < c.labels[k]; ++r)
      c.unary[c.offset[k] + r] = add_cost(c.unary[c.offset[k] + r], g.costs(i)[member_label(cl, i, r)]);
  }
  std::unordered_map<int64_t, int32_t> block_of;
  int64_t entries = 0;
  for (int32_t e = 0; e < g.num_edges(); ++e) {
    int32_t u = g.edge_a[e], v = g.edge_b[e];
    const int32_t sb = g.labels(v);
    const Cost* m = g.edge_matrix(e);
    int32_t ku = cl.cluster_of[u], kv = cl.cluster_of[v];
    if (ku == kv) {
      for (int32_t r = 0; r < c.labels[ku]; ++r) {
        const Cost x = m[int64_t(member_label(cl, u, r)) * sb + member_label(cl, v, r)];
        c.unary[c.offset[ku] + r] = add_cost(c.unary[c.offset[ku] + r], x);
      }
      continue;
    }
    const bool swapped = ku > kv;
    if (swapped) {
      std::swap(ku, kv);
      std::swap(u, v);
    }
    const int64_t key = int64_t(ku) * K + kv;
    auto [it, fresh] = block_of.try_emplace(key, static_cast<int32_t>(c.blocks.size()));
    if (fresh) {
      entries += int64_t(c.labels[ku]) * c.labels[kv];
      if (entries > kMaxColumns) {
        c.too_big = true;
        return c;
      }
      c.blocks.push_back({ku, kv, std::vector<Cost>(int64_t(c.labels[ku]) * c.labels[kv], 0.0)});
    }
    Contracted::Block& blk = c.blocks[it->second];
    const int32_t lb = c.labels[kv];
    for (int32_t r = 0; r < c.labels[ku]; ++r) {
      const int32_t su = member_label(cl, u, r);
      for (int32_t t = 0; t < lb; ++t) {
        const int32_t sv = member_label(cl, v, t);
        const Cost x = swapped ? m[int64_t(sv) * g.labels(u) + su] : m[int64_t(su) * sb + sv];
        Cost& dst = blk.m[int64_t(r) * lb + t];
        dst = add_cost(dst, x);
      }
    }
  }
  return c;
}

// The model in HiGHS's row-wise form, with x's column per (cluster, label) (-1 when the label
// is infeasible) and each y column's block entry, to write a start from a plan. Every column
// lies in [0, 1].
struct Model {
  std::vector<double> cost;
  std::vector<double> row_lo, row_hi;
  std::vector<HighsInt> start{0}, index;
  std::vector<double> value;
  std::vector<std::vector<int32_t>> x_col;  // [cluster][label]
  int64_t num_x = 0;
  struct YBlock {
    int32_t block = 0;
    std::vector<int32_t> col;  // [a * |L_b| + b], -1 where no column
  };
  std::vector<YBlock> y;
  // Memory rows not (yet) in the model: cap and terms, added where a plan breaks them.
  struct Row {
    double cap = 0;
    std::vector<std::pair<int32_t, double>> terms;
  };
  std::vector<Row> lazy_memory;
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

// Whether block m (restricted to the labels with columns) is a row term plus a column term,
// exactly in doubles; then r and c hold them.
bool additive(const Contracted& ct, const Contracted::Block& blk, const Model& md, std::vector<double>& r,
              std::vector<double>& c) {
  const int32_t la = ct.labels[blk.a], lb = ct.labels[blk.b];
  const std::vector<Cost>& m = blk.m;
  int32_t a0 = -1, b0 = -1;
  for (int32_t s = 0; s < la && a0 < 0; ++s)
    if (md.x_col[blk.a][s] >= 0) a0 = s;
  for (int32_t s = 0; s < lb && b0 < 0; ++s)
    if (md.x_col[blk.b][s] >= 0) b0 = s;
  if (a0 < 0 || b0 < 0) return false;
  r.assign(la, 0.0);
  c.assign(lb, 0.0);
  const Cost corner = m[int64_t(a0) * lb + b0];
  if (!finite(corner)) return false;
  for (int32_t t = 0; t < lb; ++t) c[t] = m[int64_t(a0) * lb + t];
  for (int32_t s = 0; s < la; ++s) {
    if (md.x_col[blk.a][s] < 0) continue;
    r[s] = m[int64_t(s) * lb + b0] - corner;
    for (int32_t t = 0; t < lb; ++t) {
      if (md.x_col[blk.b][t] < 0) continue;
      const Cost v = m[int64_t(s) * lb + t];
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

// The columns: x per allowed label (its cost with the additive blocks folded in), then y per
// finite entry of every other block. No rows yet.
void add_columns(const Contracted& ct, Model& md) {
  const int32_t K = static_cast<int32_t>(ct.labels.size());
  md.x_col.resize(K);
  for (int32_t k = 0; k < K; ++k) {
    md.x_col[k].assign(ct.labels[k], -1);
    for (int32_t s = 0; s < ct.labels[k]; ++s)
      if (finite(ct.unary[ct.offset[k] + s])) md.x_col[k][s] = 0;
  }
  std::vector<double> unary(ct.unary.begin(), ct.unary.end());
  std::vector<char> folded(ct.blocks.size(), 0);
  std::vector<double> r, c;
  for (size_t b = 0; b < ct.blocks.size(); ++b) {
    const Contracted::Block& blk = ct.blocks[b];
    if (!additive(ct, blk, md, r, c)) continue;
    folded[b] = 1;
    for (int32_t s = 0; s < ct.labels[blk.a]; ++s) unary[ct.offset[blk.a] + s] += r[s];
    for (int32_t t = 0; t < ct.labels[blk.b]; ++t) unary[ct.offset[blk.b] + t] += c[t];
  }
  for (int32_t k = 0; k < K; ++k)
    for (int32_t s = 0; s < ct.labels[k]; ++s)
      if (md.x_col[k][s] == 0) md.x_col[k][s] = md.add_column(unary[ct.offset[k] + s]);
  md.num_x = static_cast<int64_t>(md.cost.size());
  for (size_t b = 0; b < ct.blocks.size(); ++b) {
    if (folded[b]) continue;
    const Contracted::Block& blk = ct.blocks[b];
    const int32_t la = ct.labels[blk.a], lb = ct.labels[blk.b];
    Model::YBlock yb;
    yb.block = static_cast<int32_t>(b);
    yb.col.assign(int64_t(la) * lb, -1);
    for (int32_t s = 0; s < la; ++s)
      for (int32_t t = 0; t < lb; ++t)
        if (md.x_col[blk.a][s] >= 0 && md.x_col[blk.b][t] >= 0 && finite(blk.m[int64_t(s) * lb + t]))
          yb.col[int64_t(s) * lb + t] = md.add_column(blk.m[int64_t(s) * lb + t]);
    md.y.push_back(std::move(yb));
    if (static_cast<int64_t>(md.cost.size()) > kMaxColumns) {
      md.too_big = true;
      return;
    }
  }
}

// One block's marginal rows on one side: for each allowed label s of cluster `k`, the block's
// entries in s's row (stride_own) sum to x[k, s]; `other` labels at stride_other.
void add_marginal_rows(Model& md, const Model::YBlock& yb, int32_t k, int32_t other, int64_t stride_own,
                       int64_t stride_other) {
  for (int32_t s = 0; s < static_cast<int32_t>(md.x_col[k].size()); ++s) {
    if (md.x_col[k][s] < 0) continue;
    md.term(md.x_col[k][s], -1.0);
    for (int32_t t = 0; t < other; ++t) {
      const int32_t col = yb.col[s * stride_own + t * stride_other];
      if (col >= 0) md.term(col, 1.0);
    }
    md.add_row(0.0, 0.0);
  }
}

// One row per maximal live set: sum over the live members of (usage at the cluster's label -
// the member's least usage) <= limit - sum of the least usages. Built in one sweep over time
// (nodes enter at their start, leave at their end), so the cost is the rows' size, not
// rows x nodes.
std::vector<Model::Row> memory_rows(const GraphView& g, const Clusters& cl, const Contracted& ct, const Model& md,
                                    int64_t usage_limit) {
  const int32_t n = g.num_nodes;
  std::vector<int64_t> least(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = cl.cluster_of[i];
    int64_t lo = std::numeric_limits<int64_t>::max();
    for (int32_t r = 0; r < ct.labels[k]; ++r)
      if (md.x_col[k][r] >= 0) lo = std::min(lo, g.usages(i)[member_label(cl, i, r)]);
    least[i] = lo == std::numeric_limits<int64_t>::max() ? 0 : lo;
  }
  std::vector<int32_t> by_start, by_end;
  for (int32_t i = 0; i < n; ++i)
    if (g.interval[i].end > g.interval[i].start) {
      by_start.push_back(i);
      by_end.push_back(i);
    }
  std::sort(by_start.begin(), by_start.end(),
            [&](int32_t a, int32_t b) { return g.interval[a].start < g.interval[b].start; });
  std::sort(by_end.begin(), by_end.end(), [&](int32_t a, int32_t b) { return g.interval[a].end < g.interval[b].end; });
  std::vector<double> coef(md.num_x, 0.0);  // per x column: the live members' usage above least
  std::vector<int32_t> live_members(ct.labels.size(), 0);
  double live_least = 0;
  auto apply = [&](int32_t i, double sign) {
    const int32_t k = cl.cluster_of[i];
    live_members[k] += sign > 0 ? 1 : -1;
    live_least += sign * double(least[i]);
    for (int32_t r = 0; r < ct.labels[k]; ++r)
      if (md.x_col[k][r] >= 0) coef[md.x_col[k][r]] += sign * double(g.usages(i)[member_label(cl, i, r)] - least[i]);
  };
  std::vector<Model::Row> rows;
  size_t in = 0, out = 0;
  for (int64_t t : maximal_live_times(g)) {
    while (in < by_start.size() && g.interval[by_start[in]].start <= t) apply(by_start[in++], +1.0);
    while (out < by_end.size() && g.interval[by_end[out]].end <= t) apply(by_end[out++], -1.0);
    Model::Row row;
    row.cap = double(usage_limit) - live_least;
    for (int32_t k = 0; k < static_cast<int32_t>(ct.labels.size()); ++k) {
      if (live_members[k] == 0) continue;
      for (int32_t r = 0; r < ct.labels[k]; ++r) {
        const int32_t col = md.x_col[k][r];
        if (col >= 0 && coef[col] > 0.5) row.terms.emplace_back(col, coef[col]);
      }
    }
    if (!row.terms.empty() || row.cap < 0) rows.push_back(std::move(row));
  }
  return rows;
}

Model build(const GraphView& g, const Clusters& cl, const Contracted& ct, int64_t usage_limit,
            int64_t eager_memory_nonzeros) {
  Model md;
  const int32_t K = static_cast<int32_t>(ct.labels.size());
  add_columns(ct, md);
  if (md.too_big) return md;
  for (int32_t k = 0; k < K; ++k) {
    for (int32_t col : md.x_col[k])
      if (col >= 0) md.term(col, 1.0);
    md.add_row(1.0, 1.0);
  }
  for (const Model::YBlock& yb : md.y) {
    if (md.too_big) break;
    const Contracted::Block& blk = ct.blocks[yb.block];
    const int32_t la = ct.labels[blk.a], lb = ct.labels[blk.b];
    add_marginal_rows(md, yb, blk.a, lb, lb, 1);
    add_marginal_rows(md, yb, blk.b, la, 1, lb);
  }
  for (size_t k = 0; k < g.budgets.size() && !md.too_big; ++k) {
    if (!budget_can_bind(g, k)) continue;
    std::vector<double> coef(md.num_x, 0.0);
    for (int32_t i = 0; i < g.num_nodes; ++i) {
      const int32_t c = cl.cluster_of[i];
      for (int32_t r = 0; r < ct.labels[c]; ++r)
        if (md.x_col[c][r] >= 0)
          coef[md.x_col[c][r]] += double(g.budgets[k].usage[g.label_offset[i] + member_label(cl, i, r)]);
    }
    for (int64_t col = 0; col < md.num_x; ++col)
      if (coef[col] != 0) md.term(static_cast<int32_t>(col), coef[col]);
    md.add_row(static_cast<double>(g.budgets[k].low), static_cast<double>(g.budgets[k].high));
  }
  if (usage_limit >= 0 && !md.too_big) {
    std::vector<Model::Row> rows = memory_rows(g, cl, ct, md, usage_limit);
    int64_t nonzeros = 0;
    for (const Model::Row& row : rows) nonzeros += static_cast<int64_t>(row.terms.size());
    if (nonzeros <= eager_memory_nonzeros) {
      for (const Model::Row& row : rows) {
        const double scale = row_scale(row.cap);
        for (const auto& [col, v] : row.terms) md.term(col, v / scale);
        md.add_row(-kHighsInf, row.cap / scale);
      }
    } else {
      md.lazy_memory = std::move(rows);
    }
  }
  return md;
}

// The plan's labels per cluster (its roots' labels), or empty when some member disagrees
// with its root through the cluster's maps (then it breaks a bijective edge).
std::vector<int32_t> cluster_labels(const GraphView& g, const Clusters& cl, const std::vector<int32_t>& plan) {
  std::vector<int32_t> lab(cl.num_clusters());
  for (int32_t k = 0; k < cl.num_clusters(); ++k) lab[k] = plan[cl.root(k)];
  for (int32_t i = 0; i < g.num_nodes; ++i)
    if (member_label(cl, i, lab[cl.cluster_of[i]]) != plan[i]) return {};
  return lab;
}

// A start for HiGHS from cluster labels, or false when some label or pair has no column.
bool start_from(const Contracted& ct, const Model& md, const std::vector<int32_t>& lab, int32_t num_cols,
                HighsSolution& start) {
  start.col_value.assign(num_cols, 0.0);
  for (size_t k = 0; k < lab.size(); ++k) {
    const int32_t col = md.x_col[k][lab[k]];
    if (col < 0) return false;
    start.col_value[col] = 1.0;
  }
  for (const Model::YBlock& yb : md.y) {
    const Contracted::Block& blk = ct.blocks[yb.block];
    const int32_t col = yb.col[int64_t(lab[blk.a]) * ct.labels[blk.b] + lab[blk.b]];
    if (col < 0) return false;
    start.col_value[col] = 1.0;
  }
  start.value_valid = true;
  return true;
}

// The plan of the MILP's solution: every cluster takes its largest label column.
Solution plan_of(const GraphView& g, const Clusters& cl, const Contracted& ct, const Model& md,
                 const std::vector<double>& v) {
  std::vector<int32_t> lab(ct.labels.size(), 0);
  for (size_t k = 0; k < lab.size(); ++k) {
    double best = -1;
    for (int32_t r = 0; r < ct.labels[k]; ++r) {
      const int32_t col = md.x_col[k][r];
      if (col >= 0 && v[col] > best) {
        best = v[col];
        lab[k] = r;
      }
    }
  }
  Solution plan(g.num_nodes, 0);
  for (int32_t i = 0; i < g.num_nodes; ++i) plan[i] = member_label(cl, i, lab[cl.cluster_of[i]]);
  return plan;
}

// Makes a plan that breaks memory rows the model has not seen yet valid, by the search's
// greedy repair, and improves it by its descents (local_search.h); empty when that fails. It
// gives the MILP plans that fit every row before its rows are complete: on C-perturb the
// second LP round's plan, repaired, was within 2e-7 of the optimum at 6.5 s, where the first
// MILP plan came at 13 s. Built once per solve (the group graph of TreeLns is a copy of the
// problem) and reset per plan, as the search reuses its own.
class PlanRepair {
 public:
  PlanRepair(const GraphView& g, const Clusters& cl, int64_t usage_limit)
      : cl_(cl), memory_(g, usage_limit), state_(g, memory_), lns_(g, cl) {}

  Solution operator()(const Solution& plan, Clock::time_point deadline) {
    state_.reset(plan);
    if (!lns_.repair(state_, deadline)) return {};
    state_.descend_all(deadline, cl_);
    return state_.valid() ? state_.labels() : Solution{};
  }

 private:
  const Clusters& cl_;
  MemoryProfile memory_;
  PlanState state_;
  TreeLns lns_;
};

// Indices of the lazy rows the cluster labels break, at most `limit`: first the most broken
// row of each stretch of consecutive broken rows (the rows are in time order, and neighbours
// are nearly the same row), then the most broken of the rest.
std::vector<size_t> broken_rows(const Model& md, const std::vector<char>& added, const std::vector<double>& x,
                                size_t limit) {
  std::vector<double> excess(md.lazy_memory.size(), 0.0);
  for (size_t r = 0; r < md.lazy_memory.size(); ++r) {
    if (added[r]) continue;
    double activity = 0;
    for (const auto& [col, v] : md.lazy_memory[r].terms) activity += v * x[col];
    excess[r] = activity - md.lazy_memory[r].cap;
  }
  std::vector<std::pair<double, size_t>> heads, rest;
  for (size_t r = 0; r < excess.size();) {
    if (excess[r] <= 0.5) {
      ++r;
      continue;
    }
    size_t top = r;
    for (; r < excess.size() && excess[r] > 0.5; ++r) {
      if (excess[r] > excess[top]) top = r;
    }
    heads.emplace_back(-excess[top], top);
  }
  std::sort(heads.begin(), heads.end());
  std::vector<char> taken(excess.size(), 0);
  std::vector<size_t> rows;
  for (size_t k = 0; k < heads.size() && rows.size() < limit; ++k) {
    rows.push_back(heads[k].second);
    taken[heads[k].second] = 1;
  }
  for (size_t r = 0; r < excess.size(); ++r)
    if (excess[r] > 0.5 && !taken[r]) rest.emplace_back(-excess[r], r);
  std::sort(rest.begin(), rest.end());
  for (size_t k = 0; k < rest.size() && rows.size() < limit; ++k) rows.push_back(rest[k].second);
  return rows;
}

}  // namespace

MilpSize milp_size(const GraphView& g, const Clusters& clusters, int64_t usage_limit, int64_t eager_memory_nonzeros) {
  MilpSize size;
  const Contracted ct = contract(g, clusters);
  if (ct.too_big) return size;
  Model md;
  add_columns(ct, md);
  if (md.too_big) return size;
  size.columns = static_cast<int64_t>(md.cost.size());
  // A label column is in its cluster's row, a pair column in its two marginal rows (budget
  // rows, when they bind, add at most a label column's worth each).
  size.nonzeros = md.num_x + 2 * (size.columns - md.num_x);
  if (usage_limit >= 0) {
    int64_t nonzeros = 0;
    for (const Model::Row& row : memory_rows(g, clusters, ct, md, usage_limit))
      nonzeros += static_cast<int64_t>(row.terms.size());
    size.lazy_memory = nonzeros > eager_memory_nonzeros;
    if (!size.lazy_memory) size.nonzeros += nonzeros;
  }
  return size;
}

SolveResult solve_milp(const GraphView& g, const Clusters& cl, int64_t usage_limit, bool integer_costs,
                       const SolveOptions& o, const Solution* incumbent, const std::atomic<bool>* interrupt,
                       int64_t eager_memory_nonzeros) {
  SolveResult out;
  out.lower_bound = -kInfeasibleCost;
  const auto t_start = Clock::now();
  const auto deadline = t_start + from_seconds(o.time_limit_s);
  const Contracted ct = contract(g, cl);
  for (size_t k = 0; k < ct.labels.size() && !ct.too_big; ++k) {
    bool any = false;
    for (int32_t s = 0; s < ct.labels[k] && !any; ++s) any = finite(ct.unary[ct.offset[k] + s]);
    if (!any) return out;  // no label of cluster k is allowed: no plan (the heuristic says why)
  }
  Model md = ct.too_big ? Model{} : build(g, cl, ct, usage_limit, eager_memory_nonzeros);
  if (ct.too_big || md.too_big) {
    out.status = "MILP skipped: the model is too large";
    return out;
  }

  HighsLp lp;
  lp.num_col_ = static_cast<HighsInt>(md.cost.size());
  lp.num_row_ = static_cast<HighsInt>(md.row_lo.size());
  lp.col_cost_ = md.cost;
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
  const HighsInt num_cols = lp.num_col_;

  Highs h;
  // HiGHS logs to stdout, where `autoshard solve` writes its plan; the dispatcher reports it.
  h.setOptionValue("output_flag", !o.milp_log.empty());
  if (!o.milp_log.empty()) {  // to the file only: never onto stdout
    h.setOptionValue("log_to_console", false);
    h.setOptionValue("log_file", o.milp_log);
  }
  h.setOptionValue("threads", 1);
  h.setOptionValue("random_seed", static_cast<HighsInt>(o.seed % 2147483647));
  h.setOptionValue("mip_rel_gap", o.gap_tolerance);
  // With integer costs a gap below one unit proves the optimum (see kIntegerProofGap).
  h.setOptionValue("mip_abs_gap", integer_costs ? kIntegerProofGap : 1e-6);
  if (h.passModel(std::move(lp)) != HighsStatus::kOk) return out;
  HighsSolution start;
  bool has_start = false;
  if (incumbent != nullptr && static_cast<int32_t>(incumbent->size()) == g.num_nodes) {
    const std::vector<int32_t> lab = cluster_labels(g, cl, *incumbent);
    has_start = !lab.empty() && start_from(ct, md, lab, num_cols, start);
  }
  // HiGHS checks its own time limit less often than it offers interrupt points, so these also
  // look at the clock, and at `interrupt`. Presolve offers none (6 s on 123 k columns of
  // S-sub2000 under load): the caller's size gate keeps it short.
  struct Stop {
    const std::atomic<bool>* flag;
    Clock::time_point deadline;
  } stop{interrupt, deadline};
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

  // Memory rows left out of the model are added where a solution breaks them: first the LP
  // relaxation's, re-solved from its basis after each round of rows, until it breaks none;
  // then the MILP's, solved again after each round (every relaxation's bound is valid, and a
  // plan counts once it fits every row). The LP rounds are cheap and interruptible where each
  // MILP round starts with a presolve and its root LP from scratch: on C-perturb they found,
  // in 6 s, the rows the MILP needed (two MILP rounds took 13 s), and the LP's plan, repaired,
  // was within 2e-7 of the optimum.
  std::vector<char> added(md.lazy_memory.size(), 0);
  // HiGHS's time limit counts, for an LP, its run time summed over every run of this object,
  // for a MIP, the time of this run (its own clock). The interrupt callback does not reach the
  // MIP's LP solves, so the limit must be right: a 15 s run once took 21 s.
  auto set_time_limit = [&](bool mip) {
    const double left = std::max(0.01, to_seconds(deadline - Clock::now()));
    h.setOptionValue("time_limit", mip ? left : h.getRunTime() + left);
  };
  auto add_rows = [&](const std::vector<size_t>& rows) {
    for (size_t r : rows) {
      added[r] = 1;
      std::vector<HighsInt> idx;
      std::vector<double> val;
      const double cap = row_scale(md.lazy_memory[r].cap);
      for (const auto& [col, x] : md.lazy_memory[r].terms) {
        idx.push_back(col);
        val.push_back(x / cap);
      }
      h.addRow(-kHighsInf, md.lazy_memory[r].cap / cap, static_cast<HighsInt>(idx.size()), idx.data(), val.data());
    }
  };
  // Plans of relaxations whose rows are not complete (or that break an added row within
  // HiGHS's tolerances) are repaired; the best plan is kept and starts the next MILP round.
  PlanRepair repaired(g, cl, usage_limit);
  auto keep = [&](const Solution& plan, const char* what, int round) {
    Solution fixed = repaired(plan, deadline);
    if (fixed.empty()) return;
    const Cost cost = graph_cost(g, fixed);  // exact, where HiGHS's objective carries its tolerances
    if (o.verbose)
      std::fprintf(stderr, "[milp] %s round %d: its plan, repaired, costs %.17g (%.2fs)\n", what, round, cost,
                   seconds_since(t_start));
    if (out.found && cost >= out.cost) return;
    out.found = true;
    out.solution = std::move(fixed);
    out.cost = cost;
    const std::vector<int32_t> lab = cluster_labels(g, cl, out.solution);
    if (!lab.empty() && start_from(ct, md, lab, num_cols, start)) has_start = true;
  };

  bool rows_complete = md.lazy_memory.empty();
  // The time a MILP round needs at least: it solves its root LP from scratch, with every row
  // the LP rounds added (C-mem0.97: 8 s, where the LP rounds took 2 + 6 s), and a round that
  // cannot finish it finds nothing. The LP rounds' time, then the first MILP round's.
  double round_s = 0;
  if (!rows_complete) {
    std::vector<HighsVarType> kinds(num_cols, HighsVarType::kContinuous);
    h.changeColsIntegrality(0, num_cols - 1, kinds.data());
    for (int round = 0; Clock::now() < deadline && !(interrupt != nullptr && interrupt->load()); ++round) {
      const auto t_round = Clock::now();
      set_time_limit(false);
      h.run();
      if (h.getModelStatus() != HighsModelStatus::kOptimal) break;
      round_s += seconds_since(t_round);
      // The LP's optimum with some of the rows bounds the problem from below.
      out.lower_bound = std::max(out.lower_bound, h.getInfo().objective_function_value);
      const std::vector<double>& v = h.getSolution().col_value;
      const std::vector<size_t> broken = broken_rows(md, added, v, kRowsPerRound);
      if (o.verbose)
        std::fprintf(stderr, "[milp] LP round %d: objective %.17g, %zu of %zu memory rows broken (%.2fs)\n", round,
                     h.getInfo().objective_function_value, broken.size(), md.lazy_memory.size(),
                     seconds_since(t_start));
      keep(plan_of(g, cl, ct, md, v), "LP", round);
      rows_complete = broken.empty();
      if (rows_complete) break;
      add_rows(broken);
    }
    for (int64_t k = 0; k < md.num_x; ++k) kinds[k] = HighsVarType::kInteger;
    h.changeColsIntegrality(0, num_cols - 1, kinds.data());
  }

  bool proven = false;
  std::string last = "time limit";
  // Rounds that add rows only need a plan to find the rows it breaks, not its proof: while
  // the rows may be incomplete they stop at kRoundGap; once a plan breaks no row, the model
  // is solved again to the real gap from it.
  bool loose = !rows_complete;
  for (int round = 0; Clock::now() < deadline; ++round) {
    if (interrupt != nullptr && interrupt->load()) break;
    if (to_seconds(deadline - Clock::now()) < round_s) break;  // (each round's model is larger)
    const auto t_round = Clock::now();
    set_time_limit(true);
    h.setOptionValue("mip_rel_gap", loose ? std::max(o.gap_tolerance, kRoundGap) : o.gap_tolerance);
    if (has_start) h.setSolution(start);
    h.run();
    const HighsInfo& info = h.getInfo();
    const HighsModelStatus status = h.getModelStatus();
    if (status == HighsModelStatus::kInfeasible) {
      // Not turned into a bound: within HiGHS's tolerances a plan may still exist, and the
      // heuristic's plans are checked exactly.
      last = "infeasible";
      break;
    }
    if (std::isfinite(info.mip_dual_bound)) out.lower_bound = std::max(out.lower_bound, info.mip_dual_bound);
    if (info.primal_solution_status != kSolutionStatusFeasible) break;
    const std::vector<double>& v = h.getSolution().col_value;
    if (round == 0) round_s = std::max(round_s, seconds_since(t_round));
    const std::vector<size_t> broken = broken_rows(md, added, v, kRowsPerRound);
    if (o.verbose)
      std::fprintf(stderr, "[milp] round %d: %s, objective %.17g, bound %.17g, %zu of %zu memory rows broken (%.2fs)\n",
                   round, h.modelStatusToString(status).c_str(), info.objective_function_value, info.mip_dual_bound,
                   broken.size(), md.lazy_memory.size(), seconds_since(t_start));
    keep(plan_of(g, cl, ct, md, v), "MILP", round);
    if (broken.empty()) {
      const bool within = bound_proves_optimal(info.objective_function_value, info.mip_dual_bound, integer_costs) ||
                          info.mip_gap <= o.gap_tolerance;
      if (loose && status == HighsModelStatus::kOptimal && !within) {
        loose = false;  // the rows are complete: the same model again, to the real gap, from the best plan
        continue;
      }
      proven = status == HighsModelStatus::kOptimal;
      break;
    }
    if (status != HighsModelStatus::kOptimal) break;  // out of time on this round
    add_rows(broken);
    last = "row generation";
  }
  out.status = proven ? "optimal (MILP)" : last == "infeasible" ? "MILP: infeasible" : "time limit (MILP)";
  return out;
}

}  // namespace autoshard::detail
