#include "graph_view.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace autoshard::detail {
namespace {

// Points every edge whose matrix equals an earlier edge's (same shape, same bytes) at that
// earlier copy. Message passing reads every matrix twice per sweep and is bound by memory
// bandwidth on large tables; models repeat layers, so most tables come in copies (the 3-D
// Llama planner problem: 71 M entries, 14 M distinct), and one copy stays in cache longer.
void share_identical_matrices(GraphView& g) {
  // A hash of the shape and of every entry, in four independent lanes so that it runs near
  // memory speed; equal hashes are then compared in full. (A hash of sampled entries was
  // cheaper but would let tables that differ in a few entries pile up in one bucket, each
  // new one compared in full against all of them.)
  auto hash = [&](int32_t e) {
    const int64_t rows = g.num_labels[g.edge_a[e]], cols = g.num_labels[g.edge_b[e]], size = rows * cols;
    constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
    uint64_t lane[4] = {uint64_t(rows), uint64_t(cols), 1, 2};
    const Cost* m = g.matrix_at[e];
    int64_t k = 0;
    for (; k + 4 <= size; k += 4)
      for (int l = 0; l < 4; ++l) lane[l] = (lane[l] ^ std::bit_cast<uint64_t>(m[k + l])) * kMul;
    for (; k < size; ++k) lane[0] = (lane[0] ^ std::bit_cast<uint64_t>(m[k])) * kMul;
    uint64_t h = 0;
    for (uint64_t v : lane) h = (h ^ (v >> 29) ^ v) * kMul;
    return h;
  };
  std::unordered_map<uint64_t, std::vector<int32_t>> first_of_hash;
  for (int32_t e = 0; e < static_cast<int32_t>(g.num_edges()); ++e) {
    const int32_t rows = g.num_labels[g.edge_a[e]], cols = g.num_labels[g.edge_b[e]];
    auto& candidates = first_of_hash[hash(e)];
    bool shared = false;
    for (int32_t f : candidates) {
      if (g.num_labels[g.edge_a[f]] != rows || g.num_labels[g.edge_b[f]] != cols) continue;
      if (std::memcmp(g.matrix_at[f], g.matrix_at[e], sizeof(Cost) * static_cast<size_t>(rows) * cols) == 0) {
        g.matrix_at[e] = g.matrix_at[f];
        shared = true;
        break;
      }
    }
    if (!shared) candidates.push_back(e);
  }
}

}  // namespace

GraphView build_graph_view(const Problem& p, const std::vector<const Cost*>* shared) {
  auto shared_at = [&](size_t k) -> const Cost* { return shared && k < shared->size() ? (*shared)[k] : nullptr; };
  GraphView g;
  const int32_t n = static_cast<int32_t>(p.num_nodes());
  g.num_nodes = n;
  g.num_labels.resize(n);
  g.label_offset.assign(n + 1, 0);
  for (int32_t i = 0; i < n; ++i) {
    g.num_labels[i] = static_cast<int32_t>(p.node_costs[i].size());
    if (g.num_labels[i] == 0)
      throw std::invalid_argument("node " + std::to_string(i) + " has no strategy; every node needs at least one");
    g.label_offset[i + 1] = g.label_offset[i] + g.num_labels[i];
  }
  g.node_cost.resize(g.label_offset[n]);
  g.usage.assign(g.label_offset[n], 0);
  g.interval.resize(n);
  g.usage_limit = p.usage_limit;
  for (int32_t i = 0; i < n; ++i) {
    std::copy(p.node_costs[i].begin(), p.node_costs[i].end(), g.node_cost.begin() + g.label_offset[i]);
    if (i < static_cast<int32_t>(p.intervals.size())) g.interval[i] = p.intervals[i];
    const bool live = g.interval[i].end > g.interval[i].start;
    if (live && i < static_cast<int32_t>(p.node_usages.size()) && !p.node_usages[i].empty())
      std::copy(p.node_usages[i].begin(), p.node_usages[i].end(), g.usage.begin() + g.label_offset[i]);
  }

  for (const GlobalBudget& b : p.budgets) {
    GraphView::Budget vb;
    vb.low = b.low;
    vb.high = b.high;
    vb.usage.assign(g.label_offset[n], 0);
    for (int32_t i = 0; i < n && i < static_cast<int32_t>(b.usage.size()); ++i)
      if (!b.usage[i].empty()) std::copy(b.usage[i].begin(), b.usage[i].end(), vb.usage.begin() + g.label_offset[i]);
    g.budgets.push_back(std::move(vb));
  }

  // Merge parallel edges (either orientation) into one matrix keyed by (min, max).
  std::unordered_map<uint64_t, int32_t> index_of_pair;
  index_of_pair.reserve(p.edges.size() * 2);
  std::vector<int32_t> edge_of_input(p.edges.size(), -1);
  for (size_t k = 0; k < p.edges.size(); ++k) {
    const Edge& e = p.edges[k];
    if (e.u == e.v) continue;
    const int32_t a = std::min(e.u, e.v), b = std::max(e.u, e.v);
    const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
    auto [it, inserted] = index_of_pair.emplace(key, static_cast<int32_t>(g.edge_a.size()));
    if (inserted) {
      g.edge_a.push_back(a);
      g.edge_b.push_back(b);
    }
    edge_of_input[k] = it->second;
  }
  const int32_t m = static_cast<int32_t>(g.edge_a.size());
  // A merged edge made of one shared input edge in (a, b) order is referenced, not copied.
  std::vector<int32_t> inputs(m, 0);
  for (size_t k = 0; k < p.edges.size(); ++k)
    if (edge_of_input[k] >= 0) ++inputs[edge_of_input[k]];
  g.matrix_at.assign(m, nullptr);
  for (size_t k = 0; k < p.edges.size(); ++k)
    if (edge_of_input[k] >= 0 && inputs[edge_of_input[k]] == 1 && shared_at(k) && p.edges[k].u < p.edges[k].v)
      g.matrix_at[edge_of_input[k]] = shared_at(k);
  g.matrix_offset.assign(m + 1, 0);
  for (int32_t e = 0; e < m; ++e)
    g.matrix_offset[e + 1] =
        g.matrix_offset[e] +
        (g.matrix_at[e] ? 0 : static_cast<int64_t>(g.num_labels[g.edge_a[e]]) * g.num_labels[g.edge_b[e]]);
  g.matrix.assign(g.matrix_offset[m], 0.0);
  // Sums in input-edge order; one with an infeasible term stays infeasible whatever is added.
  auto add = [](Cost& sum, Cost c) { sum = is_infeasible(sum) || is_infeasible(c) ? kInfeasibleCost : sum + c; };
  for (size_t k = 0; k < p.edges.size(); ++k) {
    const Edge& e = p.edges[k];
    const int32_t su = g.num_labels[e.u], sv = g.num_labels[e.v];
    const Cost* costs = shared_at(k) ? shared_at(k) : e.costs.data();
    if (!shared_at(k) && static_cast<int64_t>(e.costs.size()) != static_cast<int64_t>(su) * sv)
      throw std::invalid_argument("edge " + std::to_string(k) + " has " + std::to_string(e.costs.size()) +
                                  " costs, expected |S_u| x |S_v| = " + std::to_string(int64_t(su) * sv));
    if (e.u == e.v) {
      for (int32_t s = 0; s < su; ++s) add(g.node_cost[g.label_offset[e.u] + s], costs[int64_t(s) * sv + s]);
      continue;
    }
    if (g.matrix_at[edge_of_input[k]]) continue;  // referenced where it is
    Cost* mat = g.matrix.data() + g.matrix_offset[edge_of_input[k]];
    if (e.u < e.v) {
      for (int64_t t = 0; t < int64_t(su) * sv; ++t) add(mat[t], costs[t]);
    } else {  // stored as (v, u): transpose
      for (int32_t a = 0; a < su; ++a)
        for (int32_t b = 0; b < sv; ++b) add(mat[int64_t(b) * su + a], costs[int64_t(a) * sv + b]);
    }
  }
  // One stored value for every infeasible entry (inputs may mark them with anything above).
  for (Cost& c : g.matrix) c = std::min(c, kInfeasibleCost);
  for (Cost& c : g.node_cost) c = std::min(c, kInfeasibleCost);
  for (int32_t e = 0; e < m; ++e)
    if (!g.matrix_at[e]) g.matrix_at[e] = g.matrix.data() + g.matrix_offset[e];
  share_identical_matrices(g);

  g.adj_offset.assign(n + 1, 0);
  for (int32_t e = 0; e < m; ++e) {
    ++g.adj_offset[g.edge_a[e] + 1];
    ++g.adj_offset[g.edge_b[e] + 1];
  }
  for (int32_t i = 0; i < n; ++i) g.adj_offset[i + 1] += g.adj_offset[i];
  g.adj_edge.resize(g.adj_offset[n]);
  g.adj_other.resize(g.adj_offset[n]);
  std::vector<int64_t> fill(g.adj_offset.begin(), g.adj_offset.end() - 1);
  for (int32_t e = 0; e < m; ++e) {
    const int32_t a = g.edge_a[e], b = g.edge_b[e];
    g.adj_edge[fill[a]] = e;
    g.adj_other[fill[a]++] = b;
    g.adj_edge[fill[b]] = e;
    g.adj_other[fill[b]++] = a;
  }
  return g;
}

bool already_clamped(const std::vector<Cost>& costs) {
  // Branch-free within blocks, so that it vectorises: it reads every matrix of a problem.
  constexpr uint64_t kNegativeZero = 0x8000000000000000ull;
  constexpr size_t kBlock = 1024;
  for (size_t start = 0; start < costs.size(); start += kBlock) {
    const size_t end = std::min(costs.size(), start + kBlock);
    bool bad = false;
    for (size_t k = start; k < end; ++k)
      bad |= !(costs[k] <= kInfeasibleCost) | (std::bit_cast<uint64_t>(costs[k]) == kNegativeZero);
    if (bad) return false;
  }
  return true;
}

std::vector<const Cost*> referable_matrices(const Problem& p) {
  std::vector<const Cost*> shared(p.edges.size(), nullptr);
  for (size_t k = 0; k < p.edges.size(); ++k) {
    const Edge& e = p.edges[k];
    if (e.u >= e.v || e.u < 0 || static_cast<size_t>(e.v) >= p.num_nodes()) continue;  // copied anyway
    const int64_t expected = static_cast<int64_t>(p.node_costs[e.u].size()) * p.node_costs[e.v].size();
    if (static_cast<int64_t>(e.costs.size()) == expected && already_clamped(e.costs)) shared[k] = e.costs.data();
  }
  return shared;
}

GraphView build_referencing_view(const Problem& p) {
  const std::vector<const Cost*> shared = referable_matrices(p);
  return build_graph_view(p, &shared);
}

Cost graph_cost(const GraphView& g, const std::vector<int32_t>& x) {
  Cost total = 0;
  for (int32_t i = 0; i < g.num_nodes; ++i) total += g.costs(i)[x[i]];
  for (int32_t e = 0; e < g.num_edges(); ++e)
    total += g.edge_matrix(e)[int64_t(x[g.edge_a[e]]) * g.num_labels[g.edge_b[e]] + x[g.edge_b[e]]];
  return total;
}

LivePoints live_points(const GraphView& g) {
  const int32_t n = g.num_nodes;
  LivePoints pts;
  std::vector<uint8_t> matters(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    if (g.interval[i].end <= g.interval[i].start) continue;
    for (int32_t s = 0; s < g.labels(i); ++s) matters[i] |= g.usages(i)[s] != 0;
    if (matters[i]) pts.times.push_back(g.interval[i].start);
  }
  std::sort(pts.times.begin(), pts.times.end());
  pts.times.erase(std::unique(pts.times.begin(), pts.times.end()), pts.times.end());
  pts.first.assign(n, 0);
  pts.last.assign(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    if (!matters[i]) continue;
    pts.first[i] =
        int32_t(std::lower_bound(pts.times.begin(), pts.times.end(), g.interval[i].start) - pts.times.begin());
    pts.last[i] = int32_t(std::lower_bound(pts.times.begin(), pts.times.end(), g.interval[i].end) - pts.times.begin());
  }
  return pts;
}

bool budget_can_bind(const GraphView& g, size_t k) {
  int64_t lo = 0, hi = 0;
  for (int32_t i = 0; i < g.num_nodes; ++i) {
    const int64_t* u = g.budgets[k].usage.data() + g.label_offset[i];
    lo += *std::min_element(u, u + g.labels(i));
    hi += *std::max_element(u, u + g.labels(i));
  }
  return hi > g.budgets[k].high || lo < g.budgets[k].low;
}

}  // namespace autoshard::detail
