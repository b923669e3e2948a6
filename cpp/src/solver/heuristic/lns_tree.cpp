#include "heuristic/lns_tree.h"

#include <algorithm>
#include <limits>

#include "heuristic/min_plus.h"

namespace autoshard::detail {

TreeLns::TreeLns(const GraphView& g, const Clusters& cl) : g_(g), cl_(cl) {
  // The group graph as a Problem, then viewed like any other (parallel edges merged).
  Problem p;
  const int32_t C = cl.num_clusters();
  p.node_costs.resize(C);
  for (int32_t c = 0; c < C; ++c) {
    const int32_t S = g.labels(cl.root(c));
    auto& cost = p.node_costs[c];
    cost.assign(S, 0.0);
    const int32_t* mem = cl.members.data() + cl.member_offset[c];
    for (int32_t k = 0; k < cl.size(c); ++k) {
      const int32_t m = mem[k];
      const int32_t* lab = cl.label_of_root.data() + cl.map_offset[m];
      for (int32_t r = 0; r < S; ++r) cost[r] += g.costs(m)[lab[r]];
    }
  }
  // A node alone in its group labels the group as itself: its edges to other such nodes are
  // the group graph's edges as they stand, referenced instead of copied (the copies took 3 s
  // of a 10 s limit on Llama-3-405B's tied problem: 474 groups of 475 nodes).
  auto as_itself = [&](int32_t c) {
    if (cl.size(c) != 1) return false;
    const int32_t r = cl.root(c);
    const int32_t* lab = cl.label_of_root.data() + cl.map_offset[r];
    for (int32_t l = 0; l < g.labels(r); ++l)
      if (lab[l] != l) return false;
    return true;
  };
  std::vector<char> plain(C);
  for (int32_t c = 0; c < C; ++c) plain[c] = as_itself(c);
  std::vector<const Cost*> shared;  // per edge of p
  for (int32_t e = 0; e < g.num_edges(); ++e) {
    const int32_t a = g.edge_a[e], b = g.edge_b[e];
    const int32_t ca = cl.cluster_of[a], cb = cl.cluster_of[b];
    const int32_t* la = cl.label_of_root.data() + cl.map_offset[a];
    const int32_t* lb = cl.label_of_root.data() + cl.map_offset[b];
    const int32_t Sa = g.labels(cl.root(ca)), Sb = g.labels(cl.root(cb));
    const Cost* m = g.edge_matrix(e);
    const int32_t nb = g.labels(b);
    if (ca == cb) {
      for (int32_t r = 0; r < Sa; ++r) p.node_costs[ca][r] += m[int64_t(la[r]) * nb + lb[r]];
      continue;
    }
    Edge se;
    se.u = ca;
    se.v = cb;
    if (plain[ca] && plain[cb]) {
      shared.resize(p.edges.size() + 1, nullptr);
      shared.back() = m;
    } else {
      se.costs.resize(int64_t(Sa) * Sb);
      for (int32_t r = 0; r < Sa; ++r)
        for (int32_t q = 0; q < Sb; ++q) se.costs[int64_t(r) * Sb + q] = m[int64_t(la[r]) * nb + lb[q]];
    }
    p.edges.push_back(std::move(se));
  }
  for (auto& row : p.node_costs)
    for (Cost& x : row) x = std::min(x, kInfeasibleCost);
  super_ = build_graph_view(p, &shared);
  super_price_.assign(super_.node_cost.size(), 0.0);
  in_tree_.assign(C, 0);
  parent_.assign(C, -1);
  parent_slot_.assign(C, -1);
  label_.assign(C, 0);
  table_offset_.assign(C, 0);
}

void TreeLns::set_prices(const std::vector<Cost>& price) {
  std::fill(super_price_.begin(), super_price_.end(), 0.0);
  for (int32_t c = 0; c < cl_.num_clusters(); ++c) {
    const int32_t S = super_.labels(c);
    const int32_t* mem = cl_.members.data() + cl_.member_offset[c];
    for (int32_t k = 0; k < cl_.size(c); ++k) {
      const int32_t m = mem[k];
      const int32_t* lab = cl_.label_of_root.data() + cl_.map_offset[m];
      for (int32_t r = 0; r < S; ++r) super_price_[super_.label_offset[c] + r] += price[g_.label_offset[m] + lab[r]];
    }
  }
}

bool TreeLns::repair(PlanState& state, Clock::time_point deadline) {
  MemoryProfile& memory = state.memory();
  const int64_t limit = memory.limit();
  const int32_t C = cl_.num_clusters();
  // A group move lowers the usage at the peak but may raise it where other members are live,
  // so moves can cycle between two peaks (small clustered problems did, until the deadline).
  // A repair that works moves each group a few times at most: past as many steps as the
  // groups have labels, it gives up.
  const int64_t max_steps = static_cast<int64_t>(super_.node_cost.size());
  for (int64_t step = 0; memory.limited() && memory.peak() > limit; ++step) {
    if (step >= max_steps || ((step & 7) == 0 && Clock::now() > deadline)) return false;
    const auto& x = state.labels();
    const int32_t t = memory.peak_point();
    const int64_t excess = memory.peak() - limit;
    double best_ratio = std::numeric_limits<double>::infinity();
    int32_t best_c = -1, best_r = -1;
    for (int32_t c = 0; c < C; ++c) {
      const int32_t S = super_.labels(c);
      const int32_t* mem = cl_.members.data() + cl_.member_offset[c];
      bool live = false;
      du_.assign(S, 0);
      for (int32_t k = 0; k < cl_.size(c); ++k) {
        const int32_t m = mem[k];
        if (memory.first(m) > t || memory.last(m) <= t) continue;
        live = true;
        const int32_t* lab = cl_.label_of_root.data() + cl_.map_offset[m];
        const int64_t* u = g_.usages(m);
        for (int32_t r = 0; r < S; ++r) du_[r] += u[lab[r]] - u[x[m]];
      }
      if (!live) continue;
      bool any = false;
      for (int32_t r = 0; r < S && !any; ++r) any = du_[r] < 0;
      if (!any) continue;
      // Group cost of every label with the neighbouring groups as they are.
      const int32_t root = cl_.root(c);
      const int32_t cur = cl_.root_of_label[cl_.map_offset[root] + x[root]];
      local_.assign(super_.costs(c), super_.costs(c) + S);
      for (int64_t k = super_.adj_offset[c]; k < super_.adj_offset[c + 1]; ++k) {
        const int32_t j = super_.adj_other[k], e = super_.adj_edge[k];
        const int32_t rj = cl_.root(j);
        const int32_t yj = cl_.root_of_label[cl_.map_offset[rj] + x[rj]];
        for (int32_t r = 0; r < S; ++r) local_[r] += super_.edge_cost(e, c, r, yj);
      }
      for (int32_t r = 0; r < S; ++r) {
        if (du_[r] >= 0 || is_infeasible(local_[r])) continue;
        const double ratio = (local_[r] - local_[cur]) / double(std::min<int64_t>(-du_[r], excess));
        if (ratio < best_ratio) {
          best_ratio = ratio;
          best_c = c;
          best_r = r;
        }
      }
    }
    if (best_c < 0) return false;
    const int32_t* mem = cl_.members.data() + cl_.member_offset[best_c];
    for (int32_t k = 0; k < cl_.size(best_c); ++k) {
      const int32_t m = mem[k];
      const int32_t s = cl_.label_of_root[cl_.map_offset[m] + best_r];
      if (s != x[m]) state.move(m, s, state.move_delta(m, s));
    }
    state.recompute_cost();
  }
  return state.repair(deadline);  // memory now holds; this settles the budgets
}

int64_t TreeLns::run(PlanState& state, Clock::time_point deadline, int64_t max_steps, int32_t tree_size,
                     std::mt19937_64& rng, int64_t max_work) {
  const int32_t C = cl_.num_clusters();
  if (C == 0) return 0;
  int64_t improved = 0;
  std::vector<int32_t> saved_nodes, saved_labels;
  const int64_t work_start = state.work();
  for (int64_t step = 0; step < max_steps && state.work() - work_start < max_work; ++step) {
    if ((step & 15) == 0 && Clock::now() > deadline) break;
    // Current group labels (from each group's root).
    const auto& x = state.labels();
    // Grow an induced tree: a node joins only with exactly one neighbour already inside.
    const int32_t seed = int32_t(rng() % uint64_t(C));
    order_.clear();
    order_.push_back(seed);
    in_tree_[seed] = 1;
    parent_[seed] = -1;
    for (size_t head = 0; head < order_.size() && int32_t(order_.size()) < tree_size; ++head) {
      const int32_t v = order_[head];
      for (int64_t k = super_.adj_offset[v]; k < super_.adj_offset[v + 1] && int32_t(order_.size()) < tree_size; ++k) {
        const int32_t w = super_.adj_other[k];
        if (in_tree_[w]) continue;
        int32_t inside = 0;
        for (int64_t q = super_.adj_offset[w]; q < super_.adj_offset[w + 1] && inside < 2; ++q)
          inside += in_tree_[super_.adj_other[q]] != 0;
        if (inside != 1) continue;
        in_tree_[w] = 1;
        parent_[w] = v;
        parent_slot_[w] = int32_t(k);  // slot of edge (v, w) at v
        order_.push_back(w);
      }
    }
    auto group_label = [&](int32_t c) {
      const int32_t r = cl_.root(c);
      return cl_.root_of_label[cl_.map_offset[r] + x[r]];
    };
    // DP from the leaves: best_[v][l] = cost of v's subtree with v at l.
    int64_t total = 0;
    for (int32_t v : order_) {
      table_offset_[v] = total;
      total += super_.labels(v);
    }
    best_.assign(total, 0.0);
    for (int32_t v : order_) {
      const int32_t S = super_.labels(v);
      Cost* bv = best_.data() + table_offset_[v];
      for (int32_t l = 0; l < S; ++l) bv[l] = super_.costs(v)[l] + super_price_[super_.label_offset[v] + l];
      state.add_work(int64_t(S) * (1 + super_.adj_offset[v + 1] - super_.adj_offset[v]));
      for (int64_t k = super_.adj_offset[v]; k < super_.adj_offset[v + 1]; ++k) {
        const int32_t j = super_.adj_other[k];
        if (in_tree_[j]) continue;
        const int32_t yj = group_label(j);
        const int32_t e = super_.adj_edge[k];
        for (int32_t l = 0; l < S; ++l) bv[l] += super_.edge_cost(e, v, l, yj);
      }
    }
    // Children into parents, in reverse BFS order: each parent label gets its child's best
    // subtree cost (min-plus over the edge, min_plus.h).
    for (size_t idx = order_.size(); idx-- > 1;) {
      const int32_t w = order_[idx], v = parent_[w];
      const int32_t e = super_.adj_edge[parent_slot_[w]];
      const int32_t Sv = super_.labels(v), Sw = super_.labels(w);
      const Cost* bw = best_.data() + table_offset_[w];
      Cost* bv = best_.data() + table_offset_[v];
      child_best_.resize(Sv);
      if (super_.edge_a[e] == v)  // rows are v's labels
        min_plus_by_cols(bw, super_.edge_matrix(e), Sv, Sw, child_best_.data());
      else
        min_plus_by_rows(bw, super_.edge_matrix(e), Sw, Sv, child_best_.data());
      for (int32_t l = 0; l < Sv; ++l) bv[l] += child_best_[l];
      state.add_work(int64_t(Sv) * Sw);
    }
    // Labels from the root down: each child's first best label under its parent's label (found
    // here, for that one parent label, instead of for every label above).
    std::vector<int32_t>& child_choice = label_;
    {
      const Cost* b0 = best_.data() + table_offset_[seed];
      child_choice[seed] = int32_t(std::min_element(b0, b0 + super_.labels(seed)) - b0);
      for (size_t idx = 1; idx < order_.size(); ++idx) {
        const int32_t w = order_[idx], v = parent_[w];
        const int32_t e = super_.adj_edge[parent_slot_[w]], l = child_choice[v];
        const Cost* bw = best_.data() + table_offset_[w];
        Cost m = std::numeric_limits<Cost>::max();
        int32_t a = 0;
        for (int32_t q = 0; q < super_.labels(w); ++q) {
          const Cost c = bw[q] + super_.edge_cost(e, v, l, q);
          if (c < m) {
            m = c;
            a = q;
          }
        }
        child_choice[w] = a;
      }
    }
    // Apply to the plan; keep only a valid, cheaper result.
    const Cost before = state.cost();
    saved_nodes.clear();
    saved_labels.clear();
    for (int32_t c : order_) {
      const int32_t r = child_choice[c];
      if (r == group_label(c)) continue;
      const int32_t* mem = cl_.members.data() + cl_.member_offset[c];
      for (int32_t k = 0; k < cl_.size(c); ++k) {
        const int32_t m = mem[k];
        const int32_t s = cl_.label_of_root[cl_.map_offset[m] + r];
        if (s == x[m]) continue;
        saved_nodes.push_back(m);
        saved_labels.push_back(x[m]);
        state.move(m, s, state.move_delta(m, s));
      }
    }
    for (int32_t c : order_) in_tree_[c] = 0;
    if (saved_nodes.empty()) continue;
    const Cost tol = 1e-9 * std::max(1.0, std::abs(before));
    if (state.valid() && state.cost() < before - tol) {
      ++improved;
      state.recompute_cost();
    } else {
      for (size_t k = saved_nodes.size(); k-- > 0;) state.move(saved_nodes[k], saved_labels[k], 0.0);
      state.set_cost(before);
    }
  }
  return improved;
}

}  // namespace autoshard::detail
