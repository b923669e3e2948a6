#include "heuristic/graph_clusters.h"

#include <deque>

namespace autoshard::detail {
namespace {

// partner[s] = the only label of b with a finite entry in row s; empty when not bijective.
bool bijection(const GraphView& g, int32_t e, std::vector<int32_t>& a_to_b) {
  const int32_t Sa = g.labels(g.edge_a[e]), Sb = g.labels(g.edge_b[e]);
  if (Sa != Sb) return false;
  const Cost* m = g.edge_matrix(e);
  a_to_b.assign(Sa, -1);
  std::vector<uint8_t> used(Sb, 0);
  for (int32_t s = 0; s < Sa; ++s) {
    for (int32_t t = 0; t < Sb; ++t) {
      if (is_infeasible(m[int64_t(s) * Sb + t])) continue;
      if (a_to_b[s] >= 0 || used[t]) return false;
      a_to_b[s] = t;
      used[t] = 1;
    }
    if (a_to_b[s] < 0) return false;
  }
  return true;
}

}  // namespace

Clusters find_clusters(const GraphView& g) {
  const int32_t n = g.num_nodes;
  Clusters c;
  c.cluster_of.assign(n, -1);
  c.map_offset.assign(n + 1, 0);
  for (int32_t i = 0; i < n; ++i) c.map_offset[i + 1] = c.map_offset[i] + g.labels(i);
  c.label_of_root.assign(c.map_offset[n], -1);
  c.root_of_label.assign(c.map_offset[n], -1);
  c.member_offset.push_back(0);
  std::vector<int32_t> a_to_b;
  std::deque<int32_t> queue;
  for (int32_t r = 0; r < n; ++r) {
    if (c.cluster_of[r] >= 0) continue;
    const int32_t id = c.num_clusters();
    c.cluster_of[r] = id;
    for (int32_t s = 0; s < g.labels(r); ++s)
      c.label_of_root[c.map_offset[r] + s] = c.root_of_label[c.map_offset[r] + s] = s;
    queue.push_back(r);
    while (!queue.empty()) {
      const int32_t u = queue.front();
      queue.pop_front();
      c.members.push_back(u);
      for (int64_t k = g.adj_offset[u]; k < g.adj_offset[u + 1]; ++k) {
        const int32_t w = g.adj_other[k], e = g.adj_edge[k];
        if (c.cluster_of[w] >= 0 || !bijection(g, e, a_to_b)) continue;
        c.cluster_of[w] = id;
        const int32_t S = g.labels(r);
        for (int32_t rl = 0; rl < S; ++rl) {
          const int32_t lu = c.label_of_root[c.map_offset[u] + rl];
          int32_t lw;
          if (g.edge_a[e] == u) {
            lw = a_to_b[lu];
          } else {
            lw = -1;
            for (int32_t t = 0; t < S; ++t)
              if (a_to_b[t] == lu) lw = t;
          }
          c.label_of_root[c.map_offset[w] + rl] = lw;
          c.root_of_label[c.map_offset[w] + lw] = rl;
        }
        queue.push_back(w);
      }
    }
    c.member_offset.push_back(static_cast<int32_t>(c.members.size()));
  }
  return c;
}

}  // namespace autoshard::detail
