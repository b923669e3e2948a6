// Exact reductions (see autoshard/reduce.h). The working state keeps every matrix indexed by
// ORIGINAL strategy numbers plus an alive mask per node, so removals never re-index anything
// and elimination records can be replayed directly on the original plan.
#include "autoshard/reduce.h"

#include "autoshard/clock.h"
#include "graph_view.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <stdexcept>
#include <unordered_map>

namespace autoshard {
namespace {

struct WorkEdge {
  int32_t a = 0, b = 0;  // a < b; matrix |S_a| x |S_b| (original sizes) row-major
  // The matrix is the problem's own (`src`) until something writes to it, and then a copy in
  // `m`: most edges are never written (only merges and eliminations change a matrix), and
  // copying every matrix of a large problem cost as much as the reductions themselves.
  const Cost* src = nullptr;
  std::vector<Cost> m;
  bool alive = true;
  const Cost* data() const { return src ? src : m.data(); }
};

class Reducer {
 public:
  Reducer(const Problem& p, const ReduceOptions& o, Reduction& out) : p_(p), opt_(o), out_(out) {}

  void run() {
    build();
    if (out_.infeasible) return;
    for (int round = 0; round < 20; ++round) {
      bool changed = false;
      if (opt_.remove_infeasible) {
        changed |= arc_consistency();
        if (out_.infeasible) return;
        changed |= memory_prune();
        if (out_.infeasible) return;
        changed |= budget_prune();
        if (out_.infeasible) return;
        if (changed) changed |= arc_consistency();
        if (out_.infeasible) return;
      }
      if (opt_.remove_dominated) changed |= remove_dominated();
      if (opt_.eliminate_memory_free) changed |= eliminate();
      if (out_.infeasible) return;
      if (!changed) break;
    }
    emit();
  }

 private:
  const Problem& p_;
  const ReduceOptions& opt_;
  Reduction& out_;
  int32_t n_ = 0;
  std::vector<int32_t> size_;                // original strategy count
  std::vector<std::vector<Cost>> cost_;      // per node, original-indexed
  std::vector<std::vector<uint8_t>> alive_;  // per node, per original strategy
  std::vector<int32_t> alive_count_;
  std::vector<uint8_t> node_alive_;
  std::vector<WorkEdge> edges_;
  std::vector<std::vector<int32_t>> adj_;  // edge ids, dead ones filtered lazily
  std::unordered_map<uint64_t, int32_t> edge_of_pair_;
  std::vector<uint8_t> low_slack_;  // per budget: its low bound cannot bind
  // Per node: something its dominance test reads changed since it was last tested (its
  // costs, its edges, a neighbour's live strategies). A node tested since finds nothing new:
  // removing one of its own strategies never makes another dominated.
  std::vector<uint8_t> dominance_dirty_;

  bool live(int32_t i) const {
    return i < static_cast<int32_t>(p_.intervals.size()) && p_.intervals[i].end > p_.intervals[i].start;
  }
  int64_t usage(int32_t i, int32_t s) const {
    if (!live(i) || i >= static_cast<int32_t>(p_.node_usages.size()) || p_.node_usages[i].empty()) return 0;
    return p_.node_usages[i][s];
  }
  int64_t budget_usage(size_t k, int32_t i, int32_t s) const {
    const auto& rows = p_.budgets[k].usage;
    if (i >= static_cast<int32_t>(rows.size()) || rows[i].empty()) return 0;
    return rows[i][s];
  }
  int64_t index(const WorkEdge& e, int32_t i, int32_t si, int32_t so) const {
    return e.a == i ? int64_t(si) * size_[e.b] + so : int64_t(so) * size_[e.b] + si;
  }
  Cost at(const WorkEdge& e, int32_t i, int32_t si, int32_t so) const { return e.data()[index(e, i, si, so)]; }
  // The edge's own copy of its matrix, to write to (zeros for an edge with none yet).
  std::vector<Cost>& writable(WorkEdge& e) {
    const int64_t size = int64_t(size_[e.a]) * size_[e.b];
    if (e.src) {
      e.m.assign(e.src, e.src + size);
      e.src = nullptr;
    } else if (int64_t(e.m.size()) != size) {
      e.m.assign(size, 0.0);
    }
    return e.m;
  }
  // A dead edge's matrix is never read again (a revived one starts from zeros).
  static void release(WorkEdge& e) {
    e.alive = false;
    e.src = nullptr;
    std::vector<Cost>().swap(e.m);
  }
  int32_t other(const WorkEdge& e, int32_t i) const { return e.a == i ? e.b : e.a; }
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(a) << 32) | uint32_t(b); }

  void kill_label(int32_t i, int32_t s) {
    alive_[i][s] = 0;
    mark_dirty(i);
    for (int32_t e : adj_[i]) dominance_dirty_[other(edges_[e], i)] = 1;
    if (--alive_count_[i] == 0) {
      out_.infeasible = true;
      out_.infeasible_reason = "node " + std::to_string(i) +
                               " has no strategy left that is finite, compatible with its "
                               "neighbours and within the memory limit";
    }
  }

  void mark_dirty(int32_t i) { dominance_dirty_[i] = 1; }

  std::vector<int32_t> alive_edges(int32_t i) {
    auto& list = adj_[i];
    list.erase(std::remove_if(list.begin(), list.end(), [&](int32_t e) { return !edges_[e].alive; }), list.end());
    return list;
  }

  int32_t add_edge(int32_t u, int32_t v) {
    const int32_t a = std::min(u, v), b = std::max(u, v);
    auto [it, inserted] = edge_of_pair_.emplace(key(a, b), static_cast<int32_t>(edges_.size()));
    if (inserted) {
      WorkEdge e;
      e.a = a;
      e.b = b;
      edges_.push_back(std::move(e));
      adj_[a].push_back(it->second);
      adj_[b].push_back(it->second);
    }
    return it->second;
  }

  void build() {
    n_ = static_cast<int32_t>(p_.num_nodes());
    out_.original_num_nodes = n_;
    size_.resize(n_);
    cost_.resize(n_);
    alive_.resize(n_);
    alive_count_.resize(n_);
    node_alive_.assign(n_, 1);
    dominance_dirty_.assign(n_, 1);
    adj_.resize(n_);
    for (int32_t i = 0; i < n_; ++i) {
      size_[i] = static_cast<int32_t>(p_.node_costs[i].size());
      if (size_[i] == 0) throw std::invalid_argument("reduce: node " + std::to_string(i) + " has no strategy");
      cost_[i] = p_.node_costs[i];
      alive_[i].assign(size_[i], 1);
      alive_count_[i] = size_[i];
      out_.stats.strategies_before += size_[i];
    }
    // Work edge of each input edge (-1: a self-loop), and how many inputs each one merges.
    std::vector<int32_t> work_of(p_.edges.size(), -1);
    std::vector<int32_t> inputs;
    for (size_t k = 0; k < p_.edges.size(); ++k) {
      const Edge& e = p_.edges[k];
      if (int64_t(e.costs.size()) != int64_t(size_[e.u]) * size_[e.v])
        throw std::invalid_argument("reduce: edge " + std::to_string(k) + " matrix size does not match");
      if (e.u == e.v) continue;
      work_of[k] = add_edge(e.u, e.v);
      inputs.resize(edges_.size(), 0);
      ++inputs[work_of[k]];
    }
    for (size_t k = 0; k < p_.edges.size(); ++k) {
      const Edge& e = p_.edges[k];
      const int32_t su = size_[e.u], sv = size_[e.v];
      if (e.u == e.v) {
        for (int32_t s = 0; s < su; ++s) cost_[e.u][s] += e.costs[int64_t(s) * sv + s];
        continue;
      }
      WorkEdge& w = edges_[work_of[k]];
      if (inputs[work_of[k]] == 1 && e.u < e.v && detail::already_clamped(e.costs)) {
        w.src = e.costs.data();  // read where it is
        continue;
      }
      std::vector<Cost>& m = writable(w);
      for (int32_t a = 0; a < su; ++a)
        for (int32_t b = 0; b < sv; ++b) m[index(w, e.u, a, b)] += e.costs[int64_t(a) * sv + b];
    }
    for (auto& c : cost_)
      for (Cost& x : c) x = std::min(x, kInfeasibleCost);
    for (auto& e : edges_)
      for (Cost& x : e.m) x = std::min(x, kInfeasibleCost);
  }

  // Removes strategies with an infinite cost or no finite partner on some edge, to a fixpoint.
  bool arc_consistency() {
    bool changed = false;
    std::deque<int32_t> queue;
    std::vector<uint8_t> queued(n_, 0);
    for (int32_t i = 0; i < n_; ++i)
      if (node_alive_[i]) {
        queue.push_back(i);
        queued[i] = 1;
      }
    while (!queue.empty()) {
      const int32_t i = queue.front();
      queue.pop_front();
      queued[i] = 0;
      bool removed = false;
      const auto inc = alive_edges(i);
      for (int32_t s = 0; s < size_[i]; ++s) {
        if (!alive_[i][s]) continue;
        bool ok = !is_infeasible(cost_[i][s]);
        for (size_t k = 0; ok && k < inc.size(); ++k) {
          WorkEdge& e = edges_[inc[k]];
          const int32_t j = other(e, i);
          bool supported = false;
          for (int32_t t = 0; t < size_[j] && !supported; ++t)
            supported = alive_[j][t] && !is_infeasible(at(e, i, s, t));
          ok = supported;
        }
        if (!ok) {
          kill_label(i, s);
          ++out_.stats.infeasible_removed;
          if (out_.infeasible) return true;
          removed = true;
        }
      }
      if (removed) {
        changed = true;
        for (int32_t ei : inc) {
          const int32_t j = other(edges_[ei], i);
          if (!queued[j]) {
            queued[j] = 1;
            queue.push_back(j);
          }
        }
      }
    }
    return changed;
  }

  // A strategy whose extra usage over the node's cheapest-in-memory choice cannot fit at some
  // time point of its interval, even with every other live node at its smallest usage.
  bool memory_prune() {
    if (p_.usage_limit < 0) return false;
    std::vector<int64_t> starts;
    for (int32_t i = 0; i < n_; ++i)
      if (live(i)) starts.push_back(p_.intervals[i].start);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    const int32_t T = static_cast<int32_t>(starts.size());
    if (T == 0) return false;
    auto range = [&](int32_t i) {
      const auto lo = std::lower_bound(starts.begin(), starts.end(), p_.intervals[i].start) - starts.begin();
      const auto hi = std::lower_bound(starts.begin(), starts.end(), p_.intervals[i].end) - starts.begin();
      return std::pair<int32_t, int32_t>(int32_t(lo), int32_t(hi));
    };
    std::vector<int64_t> min_usage(n_, 0), diff(T + 1, 0);
    for (int32_t i = 0; i < n_; ++i) {
      if (!live(i)) continue;
      int64_t mu = INT64_MAX;
      for (int32_t s = 0; s < size_[i]; ++s)
        if (alive_[i][s]) mu = std::min(mu, usage(i, s));
      min_usage[i] = mu;
      auto [lo, hi] = range(i);
      diff[lo] += mu;
      diff[hi] -= mu;
    }
    // Sparse table for range max of the smallest possible profile.
    std::vector<std::vector<int64_t>> table(1, std::vector<int64_t>(T));
    int64_t run = 0;
    for (int32_t t = 0; t < T; ++t) table[0][t] = (run += diff[t]);
    for (int32_t k = 1; (1 << k) <= T; ++k) {
      table.emplace_back(T - (1 << k) + 1);
      for (int32_t t = 0; t + (1 << k) <= T; ++t)
        table[k][t] = std::max(table[k - 1][t], table[k - 1][t + (1 << (k - 1))]);
    }
    auto range_max = [&](int32_t lo, int32_t hi) {  // [lo, hi), non-empty
      int32_t k = 31 - __builtin_clz(uint32_t(hi - lo));
      return std::max(table[k][lo], table[k][hi - (1 << k)]);
    };
    bool changed = false;
    for (int32_t i = 0; i < n_; ++i) {
      if (!live(i)) continue;
      auto [lo, hi] = range(i);
      if (lo >= hi) continue;
      const int64_t peak = range_max(lo, hi);
      if (peak > p_.usage_limit) {
        out_.infeasible = true;
        out_.infeasible_reason = "the memory limit " + std::to_string(p_.usage_limit) +
                                 " is below the smallest possible live usage " + std::to_string(peak) + " at time " +
                                 std::to_string(starts[lo]) + " or later in node " + std::to_string(i) +
                                 "'s interval; raise the limit";
        return true;
      }
      for (int32_t s = 0; s < size_[i]; ++s) {
        if (alive_[i][s] && usage(i, s) - min_usage[i] > p_.usage_limit - peak) {
          kill_label(i, s);
          ++out_.stats.memory_removed;
          changed = true;
        }
      }
    }
    return changed;
  }

  // Sums over the nodes of their smallest and largest budget usage among live strategies
  // (eliminated nodes count with their constant usage, alive_ keeps it).
  std::pair<int64_t, int64_t> budget_range(size_t k) const {
    int64_t lo = 0, hi = 0;
    for (int32_t i = 0; i < n_; ++i) {
      int64_t mn = INT64_MAX, mx = INT64_MIN;
      for (int32_t s = 0; s < size_[i]; ++s)
        if (alive_[i][s]) {
          mn = std::min(mn, budget_usage(k, i, s));
          mx = std::max(mx, budget_usage(k, i, s));
        }
      if (mn <= mx) {
        lo += mn;
        hi += mx;
      }
    }
    return {lo, hi};
  }

  // A strategy whose budget usage above the node's smallest (below its largest) cannot be
  // made up by the other nodes: with every other node at its smallest usage the sum passes
  // `high` (at its largest, stays below `low`). A budget at its least reachable value (the
  // default parameter-memory budget 1/mesh size) pins every parameter this way.
  bool budget_prune() {
    bool changed = false;
    for (size_t k = 0; k < p_.budgets.size(); ++k) {
      const GlobalBudget& b = p_.budgets[k];
      const auto [sum_min, sum_max] = budget_range(k);
      if (sum_min > b.high || sum_max < b.low) {
        out_.infeasible = true;
        out_.infeasible_reason = "budget " + (b.name.empty() ? std::to_string(k) : "'" + b.name + "'") + " [" +
                                 std::to_string(b.low) + ", " + std::to_string(b.high) +
                                 "] cannot be met: the chosen usages add up to between " + std::to_string(sum_min) +
                                 " and " + std::to_string(sum_max);
        return true;
      }
      for (int32_t i = 0; i < n_; ++i) {
        if (!node_alive_[i] || alive_count_[i] < 2) continue;
        int64_t mn = INT64_MAX, mx = INT64_MIN;
        for (int32_t s = 0; s < size_[i]; ++s)
          if (alive_[i][s]) {
            mn = std::min(mn, budget_usage(k, i, s));
            mx = std::max(mx, budget_usage(k, i, s));
          }
        if (mn == mx) continue;
        for (int32_t s = 0; s < size_[i]; ++s) {
          if (!alive_[i][s]) continue;
          const int64_t u = budget_usage(k, i, s);
          if (u - mn > b.high - sum_min || mx - u > sum_max - b.low) {
            kill_label(i, s);
            ++out_.stats.budget_removed;
            changed = true;
            if (out_.infeasible) return true;
          }
        }
      }
    }
    return changed;
  }

  // Whether strategy b of node i dominates a on the node's own terms (cost, memory, budget
  // usages); `strictly` says whether b is better on one of them.
  bool node_terms_dominate(int32_t i, int32_t b, int32_t a, bool& strictly) {
    if (cost_[i][b] > cost_[i][a] || usage(i, b) > usage(i, a)) return false;
    strictly = cost_[i][b] < cost_[i][a] || usage(i, b) < usage(i, a);
    // Less budget usage is no worse where the budget's low bound cannot bind (every plan left
    // reaches it); otherwise the usages must be equal.
    for (size_t k = 0; k < p_.budgets.size(); ++k) {
      const int64_t ub = budget_usage(k, i, b), ua = budget_usage(k, i, a);
      if (ub == ua) continue;
      if (ub > ua || !low_slack_[k]) return false;
      strictly = true;
    }
    return true;
  }

  // Node i's live strategies, each with its costs against every live strategy of every
  // neighbour laid out in one contiguous row (edge by edge: the order the test compares in),
  // and each row's sum. Rows are kept only up to kMaxRowCells cells (else `cells` is empty
  // and the test reads the edge tables); the sums always.
  static constexpr int64_t kMaxRowCells = 2'000'000;
  struct EdgeRows {
    int64_t width = 0;
    std::vector<int32_t> slot;  // per strategy (original index): its row, -1 if dead
    std::vector<Cost> cells;    // row r at [r * width, (r + 1) * width)
    std::vector<Cost> sum;      // per strategy (original index)
  };

  EdgeRows edge_rows(int32_t i, const std::vector<int32_t>& inc) {
    EdgeRows r;
    for (int32_t ei : inc) r.width += alive_count_[other(edges_[ei], i)];
    const bool keep = int64_t(alive_count_[i]) * r.width <= kMaxRowCells;
    if (keep) r.cells.reserve(size_t(alive_count_[i]) * size_t(r.width));
    std::vector<Cost> row(r.width);
    r.slot.assign(size_[i], -1);
    r.sum.assign(size_[i], 0.0);
    int32_t rows = 0;
    for (int32_t s = 0; s < size_[i]; ++s) {
      if (!alive_[i][s]) continue;
      int64_t k = 0;
      for (int32_t ei : inc) {
        WorkEdge& e = edges_[ei];
        const int32_t j = other(e, i);
        for (int32_t t = 0; t < size_[j]; ++t)
          if (alive_[j][t]) row[k++] = at(e, i, s, t);
      }
      // Summed in row order: rounding is monotone, so b <= a cell by cell implies
      // sum(b) <= sum(a), and a larger sum rules the pair out exactly.
      Cost total = 0;
      for (k = 0; k < r.width; ++k) total += row[k];
      r.sum[s] = total;
      if (keep) {
        r.slot[s] = rows++;
        r.cells.insert(r.cells.end(), row.begin(), row.end());
      }
    }
    return r;
  }

  // Whether b dominates a: no worse on the node's terms and against every neighbour
  // strategy, better somewhere (exact ties keep the lower index).
  bool dominates(int32_t i, int32_t b, int32_t a, const std::vector<int32_t>& inc, const EdgeRows& rows) {
    bool strictly = false;
    if (!node_terms_dominate(i, b, a, strictly)) return false;
    if (rows.sum[b] > rows.sum[a]) return false;  // some cell of b exceeds a's
    if (!rows.cells.empty()) {
      const Cost* rb = rows.cells.data() + int64_t(rows.slot[b]) * rows.width;
      const Cost* ra = rows.cells.data() + int64_t(rows.slot[a]) * rows.width;
      for (int64_t k = 0; k < rows.width; ++k) {
        if (rb[k] > ra[k]) return false;
        strictly |= rb[k] < ra[k];
      }
      return strictly || b < a;
    }
    for (int32_t ei : inc) {
      WorkEdge& e = edges_[ei];
      const int32_t j = other(e, i);
      for (int32_t t = 0; t < size_[j]; ++t) {
        if (!alive_[j][t]) continue;
        const Cost cb = at(e, i, b, t), ca = at(e, i, a, t);
        if (cb > ca) return false;
        strictly |= cb < ca;
      }
    }
    return strictly || b < a;
  }

  bool remove_dominated_at(int32_t i) {
    const auto inc = alive_edges(i);
    int64_t work = 0;
    for (int32_t ei : inc) work += size_[other(edges_[ei], i)];
    if (work * alive_count_[i] * alive_count_[i] > 50'000'000) return false;  // too costly; skip
    // Killing i's own strategies changes no neighbour's, so the rows stay valid throughout.
    const EdgeRows rows = edge_rows(i, inc);
    bool changed = false;
    for (int32_t a = 0; a < size_[i]; ++a) {
      if (!alive_[i][a]) continue;
      for (int32_t b = 0; b < size_[i]; ++b) {
        if (b == a || !alive_[i][b]) continue;
        if (dominates(i, b, a, inc, rows)) {
          kill_label(i, a);
          ++out_.stats.dominated_removed;
          changed = true;
          break;
        }
      }
    }
    return changed;
  }

  bool remove_dominated() {
    bool changed = false;
    std::vector<uint8_t> slack(p_.budgets.size(), 0);
    for (size_t k = 0; k < p_.budgets.size(); ++k) slack[k] = budget_range(k).first >= p_.budgets[k].low;
    if (slack != low_slack_) dominance_dirty_.assign(n_, 1);  // every budget comparison changes
    low_slack_ = std::move(slack);
    for (int32_t i = 0; i < n_; ++i) {
      if (!dominance_dirty_[i]) continue;
      if (node_alive_[i] && alive_count_[i] >= 2) changed |= remove_dominated_at(i);
      dominance_dirty_[i] = 0;  // its own removals change nothing its test reads
    }
    return changed;
  }

  // No memory usage, and the same usage of every budget whichever live strategy it takes (a
  // constant that leaves the budget's bounds with the node; see emit).
  bool memory_free(int32_t i) const {
    int32_t first = -1;
    for (int32_t s = 0; s < size_[i]; ++s) {
      if (!alive_[i][s]) continue;
      if (usage(i, s) != 0) return false;
      if (first < 0) {
        first = s;
        continue;
      }
      for (size_t k = 0; k < p_.budgets.size(); ++k)
        if (budget_usage(k, i, s) != budget_usage(k, i, first)) return false;
    }
    return true;
  }
  int64_t constant_budget_usage(size_t k, int32_t i) const {
    for (int32_t s = 0; s < size_[i]; ++s)
      if (alive_[i][s]) return budget_usage(k, i, s);
    return 0;
  }

  bool eliminate() {
    bool changed = false;
    std::deque<int32_t> queue;
    for (int32_t i = 0; i < n_; ++i)
      if (node_alive_[i] && memory_free(i)) queue.push_back(i);
    std::vector<uint8_t> is_free(n_, 0);
    for (int32_t i : queue) is_free[i] = 1;
    while (!queue.empty()) {
      const int32_t i = queue.front();
      queue.pop_front();
      if (!node_alive_[i]) continue;
      const auto inc = alive_edges(i);
      if (inc.size() > 2) continue;
      Reduction::Elimination rec;
      rec.node = i;
      if (inc.empty()) {
        int32_t best = -1;
        for (int32_t s = 0; s < size_[i]; ++s)
          if (alive_[i][s] && (best < 0 || cost_[i][s] < cost_[i][best])) best = s;
        out_.cost_offset += cost_[i][best];
        rec.choice = {best};
      } else if (inc.size() == 1) {
        WorkEdge& e = edges_[inc[0]];
        const int32_t j = other(e, i);
        rec.first = j;
        rec.choice.assign(size_[j], -1);
        for (int32_t t = 0; t < size_[j]; ++t) {
          if (!alive_[j][t]) continue;
          Cost best = kInfeasibleCost;
          int32_t arg = -1;
          for (int32_t s = 0; s < size_[i]; ++s) {
            if (!alive_[i][s]) continue;
            const Cost c = cost_[i][s] + at(e, i, s, t);
            if (arg < 0 || c < best) {
              best = c;
              arg = s;
            }
          }
          rec.choice[t] = arg;
          cost_[j][t] = std::min(kInfeasibleCost, cost_[j][t] + best);
        }
        mark_dirty(j);
        release(e);
        if (is_free[j]) queue.push_back(j);
      } else {
        WorkEdge* e1 = &edges_[inc[0]];
        WorkEdge* e2 = &edges_[inc[1]];
        const int32_t j = other(*e1, i), k = other(*e2, i);
        if (int64_t(alive_count_[i]) * alive_count_[j] * alive_count_[k] > opt_.max_chain_work) continue;
        rec.first = j;
        rec.second = k;
        rec.second_size = size_[k];
        rec.choice.assign(int64_t(size_[j]) * size_[k], -1);
        std::vector<Cost> fold(static_cast<size_t>(size_[j]) * size_[k], kInfeasibleCost);
        // i's live strategies in increasing order, and per partner strategy a contiguous row
        // over them: (cost_i + e1) for j, e2 for k. The minimum over s then walks two rows
        // instead of two matrix columns (the same sums in the same order: the same result).
        std::vector<int32_t> live_s;
        for (int32_t s = 0; s < size_[i]; ++s)
          if (alive_[i][s]) live_s.push_back(s);
        const size_t ns = live_s.size();
        std::vector<Cost> row_j(static_cast<size_t>(size_[j]) * ns), row_k(static_cast<size_t>(size_[k]) * ns);
        for (int32_t tj = 0; tj < size_[j]; ++tj)
          if (alive_[j][tj])
            for (size_t q = 0; q < ns; ++q) row_j[tj * ns + q] = cost_[i][live_s[q]] + at(*e1, i, live_s[q], tj);
        for (int32_t tk = 0; tk < size_[k]; ++tk)
          if (alive_[k][tk])
            for (size_t q = 0; q < ns; ++q) row_k[tk * ns + q] = at(*e2, i, live_s[q], tk);
        for (int32_t tj = 0; tj < size_[j]; ++tj) {
          if (!alive_[j][tj]) continue;
          const Cost* rj = &row_j[tj * ns];
          for (int32_t tk = 0; tk < size_[k]; ++tk) {
            if (!alive_[k][tk]) continue;
            const Cost* rk = &row_k[tk * ns];
            Cost best = kInfeasibleCost;
            size_t arg = 0;
            for (size_t q = 0; q < ns; ++q) {
              const Cost c = rj[q] + rk[q];
              if (q == 0 || c < best) {
                best = c;
                arg = q;
              }
            }
            rec.choice[int64_t(tj) * size_[k] + tk] = ns ? live_s[arg] : -1;
            fold[int64_t(tj) * size_[k] + tk] = std::min(best, kInfeasibleCost);
          }
        }
        release(*e1);
        release(*e2);
        // The pair (j, k) may already have an edge; add_edge returns it (or a fresh one).
        const int32_t ejk = add_edge(j, k);
        WorkEdge& ne = edges_[ejk];
        if (!ne.alive) {  // a dead edge for this pair is revived empty (release() dropped its matrix)
          ne.alive = true;
          adj_[ne.a].push_back(ejk);
          adj_[ne.b].push_back(ejk);
        }
        std::vector<Cost>& m = writable(ne);
        for (int32_t tj = 0; tj < size_[j]; ++tj)
          for (int32_t tk = 0; tk < size_[k]; ++tk) {
            Cost& c = m[index(ne, j, tj, tk)];
            c = std::min(kInfeasibleCost, c + fold[int64_t(tj) * size_[k] + tk]);
          }
        mark_dirty(j);
        mark_dirty(k);
        if (is_free[j]) queue.push_back(j);
        if (is_free[k]) queue.push_back(k);
      }
      node_alive_[i] = 0;
      out_.eliminations.push_back(std::move(rec));
      ++out_.stats.nodes_eliminated;
      changed = true;
    }
    return changed;
  }

  void emit() {
    Problem& r = out_.reduced;
    r.name = p_.name;
    r.usage_limit = p_.usage_limit;
    std::vector<int32_t> new_index(n_, -1);
    std::vector<std::vector<int32_t>> new_label(n_);
    for (int32_t i = 0; i < n_; ++i) {
      if (!node_alive_[i]) continue;
      new_index[i] = static_cast<int32_t>(out_.original_node.size());
      out_.original_node.push_back(i);
      std::vector<int32_t> kept;
      new_label[i].assign(size_[i], -1);
      std::vector<Cost> costs;
      std::vector<int64_t> usages;
      const bool has_usage = i < int32_t(p_.node_usages.size()) && !p_.node_usages[i].empty();
      for (int32_t s = 0; s < size_[i]; ++s) {
        if (!alive_[i][s]) continue;
        new_label[i][s] = static_cast<int32_t>(kept.size());
        kept.push_back(s);
        costs.push_back(cost_[i][s]);
        if (has_usage) usages.push_back(p_.node_usages[i][s]);
      }
      out_.stats.strategies_after += static_cast<int64_t>(kept.size());
      r.node_costs.push_back(std::move(costs));
      r.node_usages.push_back(std::move(usages));
      r.intervals.push_back(i < int32_t(p_.intervals.size()) ? p_.intervals[i] : Interval{});
      if (!p_.node_names.empty()) r.node_names.push_back(p_.node_names[i]);
      out_.original_strategy.push_back(std::move(kept));
    }
    for (WorkEdge& e : edges_) {
      if (!e.alive || !node_alive_[e.a] || !node_alive_[e.b]) continue;
      Edge ne;
      ne.u = new_index[e.a];
      ne.v = new_index[e.b];
      const auto& ka = out_.original_strategy[ne.u];
      const auto& kb = out_.original_strategy[ne.v];
      ne.costs.reserve(ka.size() * kb.size());
      const bool whole_rows = int32_t(kb.size()) == size_[e.b];  // rows copied as they are
      for (int32_t sa : ka) {
        const Cost* row = e.data() + int64_t(sa) * size_[e.b];
        if (whole_rows)
          ne.costs.insert(ne.costs.end(), row, row + size_[e.b]);
        else
          for (int32_t sb : kb) ne.costs.push_back(row[sb]);
      }
      if (!std::all_of(ne.costs.begin(), ne.costs.end(), [](Cost c) { return c == 0; }))
        r.edges.push_back(std::move(ne));
      release(e);  // emitted: freed now, so the work copies and the reduced problem never all coexist
    }
    for (size_t k = 0; k < p_.budgets.size(); ++k) {
      const GlobalBudget& b = p_.budgets[k];
      GlobalBudget nb;
      nb.name = b.name;
      // Eliminated nodes take their constant usage with them.
      int64_t folded = 0;
      for (int32_t i = 0; i < n_; ++i)
        if (!node_alive_[i]) folded += constant_budget_usage(k, i);
      nb.low = std::max<int64_t>(0, b.low - folded);
      nb.high = b.high == std::numeric_limits<int64_t>::max() ? b.high : b.high - folded;
      for (size_t r_i = 0; r_i < out_.original_node.size(); ++r_i) {
        const int32_t i = out_.original_node[r_i];
        std::vector<int64_t> row;
        if (i < int32_t(b.usage.size()) && !b.usage[i].empty())
          for (int32_t s : out_.original_strategy[r_i]) row.push_back(b.usage[i][s]);
        nb.usage.push_back(std::move(row));
      }
      r.budgets.push_back(std::move(nb));
    }
  }
};

}  // namespace

Reduction reduce(const Problem& problem, const ReduceOptions& options) {
  const auto t0 = Clock::now();
  Reduction out;
  Reducer(problem, options, out).run();
  out.stats.seconds = seconds_since(t0);
  return out;
}

Solution Reduction::expand(const Solution& reduced_solution) const {
  if (reduced_solution.size() != original_node.size())
    throw std::invalid_argument("Reduction::expand: the plan has " + std::to_string(reduced_solution.size()) +
                                " entries but the reduced problem has " + std::to_string(original_node.size()) +
                                " nodes");
  Solution x(original_num_nodes, -1);
  for (size_t r = 0; r < original_node.size(); ++r) {
    const int32_t s = reduced_solution[r];
    if (s < 0 || s >= int32_t(original_strategy[r].size()))
      throw std::invalid_argument("Reduction::expand: strategy " + std::to_string(s) + " of reduced node " +
                                  std::to_string(r) + " is out of range");
    x[original_node[r]] = original_strategy[r][s];
  }
  for (auto it = eliminations.rbegin(); it != eliminations.rend(); ++it) {
    int64_t index = 0;
    if (it->first >= 0) index = int64_t(x[it->first]) * it->second_size + (it->second >= 0 ? x[it->second] : 0);
    x[it->node] = it->choice[index];
  }
  return x;
}

}  // namespace autoshard
