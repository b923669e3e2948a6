#include "heuristic/trws.h"

#include <algorithm>

#include "heuristic/min_plus.h"

namespace autoshard::detail {

Trws::Trws(const GraphView& g, bool reversed) : g_(g), reversed_(reversed), unary_(g.node_cost) {
  const int64_t slots = g.adj_offset[g.num_nodes];
  msg_offset_.assign(slots + 1, 0);
  reverse_slot_.assign(slots, -1);
  for (int32_t i = 0; i < g.num_nodes; ++i)
    for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k) msg_offset_[k + 1] = msg_offset_[k] + g.labels(i);
  msg_.assign(msg_offset_[slots], 0.0);
  // The reverse slot: the same edge seen from the other end.
  std::vector<int64_t> slot_at_a(g.num_edges(), -1), slot_at_b(g.num_edges(), -1);
  for (int32_t i = 0; i < g.num_nodes; ++i)
    for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k)
      (g.edge_a[g.adj_edge[k]] == i ? slot_at_a : slot_at_b)[g.adj_edge[k]] = k;
  for (int32_t e = 0; e < g.num_edges(); ++e) {
    reverse_slot_[slot_at_a[e]] = slot_at_b[e];
    reverse_slot_[slot_at_b[e]] = slot_at_a[e];
  }
  gamma_.assign(g.num_nodes, 1.0);
  for (int32_t i = 0; i < g.num_nodes; ++i) {
    int32_t before = 0, after = 0;
    for (int64_t k = g.adj_offset[i]; k < g.adj_offset[i + 1]; ++k) (earlier(g.adj_other[k], i) ? before : after)++;
    gamma_[i] = 1.0 / std::max({before, after, 1});
  }
}

void Trws::belief(int32_t i, std::vector<Cost>& out) const {
  const int32_t S = g_.labels(i);
  out.assign(unary_.begin() + g_.label_offset[i], unary_.begin() + g_.label_offset[i] + S);
  for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
    const Cost* m = msg_.data() + msg_offset_[k];
    for (int32_t s = 0; s < S; ++s) out[s] += m[s];
  }
}

// Sends the message from node i (whose belief is in h_) along adjacency slot `slot`.
void Trws::send(int32_t i, int64_t slot) {
  const int32_t e = g_.adj_edge[slot], j = g_.adj_other[slot];
  const int32_t Si = g_.labels(i), Sj = g_.labels(j);
  const Cost* in = msg_.data() + msg_offset_[slot];
  tmp_.resize(Si);
  const double gam = gamma_[i];
  for (int32_t s = 0; s < Si; ++s) tmp_[s] = gam * h_[s] - in[s];
  Cost* out = msg_.data() + msg_offset_[reverse_slot_[slot]];
  const Cost* m = g_.edge_matrix(e);
  if (g_.edge_a[e] == i)  // rows are i's labels
    min_plus_by_rows(tmp_.data(), m, Si, Sj, out);
  else
    min_plus_by_cols(tmp_.data(), m, Sj, Si, out);
  Cost lo = *std::min_element(out, out + Sj);
  for (int32_t t = 0; t < Sj; ++t) out[t] -= lo;
}

void Trws::start_decode() {
  if (clusters_) cluster_choice_.assign(clusters_->num_clusters(), -1);
}

int32_t Trws::pick(int32_t i, const Cost* unary, const std::vector<int32_t>& labeling) {
  if (clusters_) {
    const int32_t c = clusters_->cluster_of[i];
    if (clusters_->size(c) > 1) {
      const int64_t off = clusters_->map_offset[i];
      if (cluster_choice_[c] >= 0) {
        const int32_t forced = clusters_->label_of_root[off + cluster_choice_[c]];
        if (forced >= 0) return forced;
      }
      // First member of its group: choose the group label on the whole group's energy given
      // the decoded nodes (edges to undecoded outside nodes are estimated by their messages).
      const int32_t S = g_.labels(i);
      score_.assign(S, 0.0);
      const int32_t* mem = clusters_->members.data() + clusters_->member_offset[c];
      for (int32_t k = 0; k < clusters_->size(c); ++k) {
        const int32_t m = mem[k];
        const int32_t* lab = clusters_->label_of_root.data() + clusters_->map_offset[m];
        const Cost* um = unary + g_.label_offset[m];
        for (int32_t r = 0; r < S; ++r) score_[r] += um[lab[r]];
        for (int64_t a = g_.adj_offset[m]; a < g_.adj_offset[m + 1]; ++a) {
          const int32_t j = g_.adj_other[a], e = g_.adj_edge[a];
          if (clusters_->cluster_of[j] == c) {
            if (g_.edge_a[e] != m) continue;  // inside the group: count once
            const int32_t* labj = clusters_->label_of_root.data() + clusters_->map_offset[j];
            for (int32_t r = 0; r < S; ++r) score_[r] += g_.edge_cost(e, m, lab[r], labj[r]);
          } else if (earlier(j, i)) {
            for (int32_t r = 0; r < S; ++r) score_[r] += g_.edge_cost(e, m, lab[r], labeling[j]);
          } else {
            const Cost* msg = msg_.data() + msg_offset_[a];
            for (int32_t r = 0; r < S; ++r) score_[r] += msg[lab[r]];
          }
        }
      }
      const int32_t root_label = int32_t(std::min_element(score_.begin(), score_.end()) - score_.begin());
      cluster_choice_[c] = root_label;
      return clusters_->label_of_root[off + root_label];
    }
  }
  return int32_t(std::min_element(tmp_.begin(), tmp_.end()) - tmp_.begin());
}

void Trws::decode(const std::vector<Cost>& unary, std::vector<int32_t>& labeling) {
  labeling.assign(g_.num_nodes, 0);
  start_decode();
  for (int32_t place = 0; place < g_.num_nodes; ++place) {
    const int32_t i = node_at(place);
    const int32_t S = g_.labels(i);
    tmp_.assign(unary.begin() + g_.label_offset[i], unary.begin() + g_.label_offset[i] + S);
    for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
      const int32_t j = g_.adj_other[k], e = g_.adj_edge[k];
      if (earlier(i, j)) {
        const Cost* m = msg_.data() + msg_offset_[k];
        for (int32_t s = 0; s < S; ++s) tmp_[s] += m[s];
      } else {
        for (int32_t s = 0; s < S; ++s) tmp_[s] += g_.edge_cost(e, i, s, labeling[j]);
      }
    }
    labeling[i] = pick(i, unary.data(), labeling);
  }
}

void Trws::iterate(std::vector<int32_t>& labeling) {
  labeling.assign(g_.num_nodes, 0);
  start_decode();
  for (int32_t place = 0; place < g_.num_nodes; ++place) {
    const int32_t i = node_at(place);
    belief(i, h_);
    // Decode: earlier neighbours by their labels, later ones by their messages.
    const int32_t S = g_.labels(i);
    tmp_.assign(h_.begin(), h_.end());
    for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
      const int32_t j = g_.adj_other[k];
      if (earlier(i, j)) continue;
      const Cost* m = msg_.data() + msg_offset_[k];
      const int32_t e = g_.adj_edge[k];
      for (int32_t s = 0; s < S; ++s) tmp_[s] += g_.edge_cost(e, i, s, labeling[j]) - m[s];
    }
    labeling[i] = pick(i, unary_.data(), labeling);
    for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k)
      if (earlier(i, g_.adj_other[k])) send(i, k);
  }
  for (int32_t place = g_.num_nodes - 1; place >= 0; --place) {
    const int32_t i = node_at(place);
    belief(i, h_);
    for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k)
      if (earlier(g_.adj_other[k], i)) send(i, k);
  }
}

// The lower bound of the current reparameterisation, tightened by one forward sweep: each
// node's term (unary + messages + what earlier nodes pushed into it) is split evenly over its
// edges to later nodes and minimised out into them; a node with no later neighbour adds its
// minimum. Every step only drops a term whose minimum is 0, so the result stays a valid bound
// (exact on a tree ordered leaves-first).
Cost Trws::lower_bound() const {
  std::vector<Cost> unused_terms;
  std::vector<int32_t> unused_kept;
  return lower_bound_keeping({}, unused_terms, unused_kept);
}

Cost Trws::lower_bound_keeping(const std::vector<uint8_t>& keep, std::vector<Cost>& terms,
                               std::vector<int32_t>& kept) const {
  kept.clear();
  if (!keep.empty()) terms.resize(g_.node_cost.size());
  std::vector<Cost> pushed(g_.node_cost.size(), 0.0);
  std::vector<Cost> h, tmp, best;
  Cost bound = 0;
  for (int32_t place = 0; place < g_.num_nodes; ++place) {
    const int32_t i = node_at(place);
    belief(i, h);
    const int32_t Si = g_.labels(i);
    for (int32_t s = 0; s < Si; ++s) h[s] += pushed[g_.label_offset[i] + s];
    int32_t later = 0;
    for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) later += earlier(i, g_.adj_other[k]);
    if (later == 0) {
      if (!keep.empty() && keep[i]) {
        std::copy(h.begin(), h.end(), terms.begin() + g_.label_offset[i]);
        kept.push_back(i);
      } else {
        bound += *std::min_element(h.begin(), h.end());
      }
      continue;
    }
    for (int64_t k = g_.adj_offset[i]; k < g_.adj_offset[i + 1]; ++k) {
      const int32_t j = g_.adj_other[k];
      if (earlier(j, i)) continue;
      const int32_t e = g_.adj_edge[k], Sj = g_.labels(j);
      const Cost* into_i = msg_.data() + msg_offset_[k];
      const Cost* into_j = msg_.data() + msg_offset_[reverse_slot_[k]];
      tmp.resize(Si);
      for (int32_t s = 0; s < Si; ++s) tmp[s] = h[s] / later - into_i[s];
      const Cost* m = g_.edge_matrix(e);
      Cost* dst = pushed.data() + g_.label_offset[j];
      best.resize(Sj);
      if (g_.edge_a[e] == i)
        min_plus_by_rows(tmp.data(), m, Si, Sj, best.data());
      else
        min_plus_by_cols(tmp.data(), m, Sj, Si, best.data());
      for (int32_t t = 0; t < Sj; ++t) dst[t] += best[t] - into_j[t];
    }
  }
  return bound;
}

}  // namespace autoshard::detail
