#include "heuristic/pair_kick.h"

#include <algorithm>
#include <cmath>

namespace autoshard::detail {

PairKick::PairKick(const GraphView& g, const Clusters& clusters, const GraphView& groups)
    : g_(g), cl_(clusters), gr_(groups) {
  const int32_t C = gr_.num_nodes;
  slot_offset_.assign(gr_.adj_edge.size() + 1, 0);
  for (int32_t c = 0; c < C; ++c)
    for (int64_t k = gr_.adj_offset[c]; k < gr_.adj_offset[c + 1]; ++k)
      slot_offset_[k + 1] = slot_offset_[k] + gr_.labels(c);
  rowmin_.assign(slot_offset_.back(), 0.0);
  opt_.assign(gr_.node_cost.begin(), gr_.node_cost.end());
  slot_a_.assign(gr_.num_edges(), -1);
  slot_b_.assign(gr_.num_edges(), -1);
  for (int32_t c = 0; c < C; ++c) {
    const int32_t S = gr_.labels(c);
    for (int64_t k = gr_.adj_offset[c]; k < gr_.adj_offset[c + 1]; ++k) {
      const int32_t e = gr_.adj_edge[k], j = gr_.adj_other[k];
      (gr_.edge_a[e] == c ? slot_a_ : slot_b_)[e] = k;
      Cost* row = rowmin_.data() + slot_offset_[k];
      for (int32_t r = 0; r < S; ++r) {
        Cost m = kInfeasibleCost;
        for (int32_t t = 0; t < gr_.labels(j); ++t) m = std::min(m, gr_.edge_cost(e, c, r, t));
        row[r] = m;
        opt_[gr_.label_offset[c] + r] = std::min(kInfeasibleCost, opt_[gr_.label_offset[c] + r] + m);
      }
    }
  }
  locked_.assign(C, 0);
  queued_.assign(C, 0);
}

int32_t PairKick::group_label(const PlanState& s, int32_t c) const {
  const int32_t r = cl_.root(c);
  return cl_.root_of_label[cl_.map_offset[r] + s.labels()[r]];
}

void PairKick::group_move(PlanState& s, int32_t c, int32_t r, Cost delta) {
  if (y_[c] == r) return;
  const int32_t* mem = cl_.members.data() + cl_.member_offset[c];
  for (int32_t k = 0; k < cl_.size(c); ++k) {
    const int32_t m = mem[k];
    const int32_t to = cl_.label_of_root[cl_.map_offset[m] + r];
    if (to == s.labels()[m]) continue;
    log_.push_back({m, s.labels()[m]});
    s.move(m, to, delta);
    delta = 0;  // the whole group's change rides on its first moved member
    // PlanState counts a move as two profile walks; measured against the tree LNS, kicks took
    // about twice the time their counted work suggested (the profile updates dominate them).
    s.add_work(2 * walk_work_);
  }
  y_[c] = r;
}

void PairKick::group_costs(PlanState& s, int32_t c, std::vector<Cost>& out) const {
  const int32_t S = gr_.labels(c);
  out.assign(gr_.costs(c), gr_.costs(c) + S);
  for (int64_t k = gr_.adj_offset[c]; k < gr_.adj_offset[c + 1]; ++k) {
    const int32_t e = gr_.adj_edge[k], yj = y_[gr_.adj_other[k]];
    for (int32_t r = 0; r < S; ++r) out[r] += gr_.edge_cost(e, c, r, yj);
  }
  s.add_work(int64_t(S) * (1 + gr_.adj_offset[c + 1] - gr_.adj_offset[c]));
}

bool PairKick::trial(PlanState& s, int32_t c, int32_t r, int32_t d, int32_t q, Clock::time_point deadline) {
  const Cost before = s.cost();
  log_.clear();
  group_costs(s, c, local_);
  group_move(s, c, r, local_[r] - local_[y_[c]]);
  group_costs(s, d, local_);
  group_move(s, d, q, local_[q] - local_[y_[d]]);
  locked_[c] = locked_[d] = 1;
  // Settle: best-improvement group descent outwards from the kicked pair (FIFO, so the groups
  // next to the pair settle first). Memory is not checked on the way: the kick usually frees
  // some, and a result over the limit is dropped below.
  queue_.clear();
  for (int32_t v : {c, d})
    for (int64_t k = gr_.adj_offset[v]; k < gr_.adj_offset[v + 1]; ++k) {
      const int32_t j = gr_.adj_other[k];
      if (!locked_[j] && !queued_[j]) {
        queued_[j] = 1;
        queue_.push_back(j);
      }
    }
  int32_t moves = 0;
  bool stop = false;
  for (size_t head = 0; head < queue_.size(); ++head) {
    const int32_t v = queue_[head];
    queued_[v] = 0;
    if ((head & 63) == 63 && Clock::now() > deadline) stop = true;
    if (stop || moves >= kSettleMoves) continue;  // drains the queue's flags
    group_costs(s, v, local_);
    const int32_t cur = y_[v];
    int32_t best = cur;
    for (int32_t l = 0; l < gr_.labels(v); ++l)
      if (local_[l] < local_[best]) best = l;
    if (best == cur || !(local_[best] < local_[cur] - 1e-9 * std::max(1.0, std::abs(local_[cur])))) continue;
    group_move(s, v, best, local_[best] - local_[cur]);
    ++moves;
    for (int64_t k = gr_.adj_offset[v]; k < gr_.adj_offset[v + 1]; ++k) {
      const int32_t j = gr_.adj_other[k];
      if (!locked_[j] && !queued_[j]) {
        queued_[j] = 1;
        queue_.push_back(j);
      }
    }
  }
  locked_[c] = locked_[d] = 0;
  // The running cost went through infeasible entries (~1e18, a few hundred units of rounding
  // each): it only filters (a gain lost in that rounding is not worth a recount), and an exact
  // recount decides. Most kicks settle back to a plan no cheaper than before.
  const Cost tol = 1e-9 * std::max(1.0, std::abs(before));
  if (s.memory_ok() && s.budgets_ok() && s.cost() < before - tol) {
    s.add_work(g_.num_nodes + int64_t(g_.adj_other.size()));
    const Cost exact = graph_cost(g_, s.labels());
    if (exact < before - tol && !is_infeasible(exact)) {
      s.set_cost(exact);
      return true;
    }
  }
  for (auto it = log_.rbegin(); it != log_.rend(); ++it) {
    const int32_t m = it->first;
    s.move(m, it->second, 0.0);
    const int32_t gc = cl_.cluster_of[m];
    y_[gc] = group_label(s, gc);
  }
  s.set_cost(before);
  return false;
}

int64_t PairKick::run(PlanState& s, Clock::time_point deadline, int32_t max_trials, int64_t max_work) {
  const int32_t C = gr_.num_nodes;
  if (C < 2 || max_trials <= 0) return 0;
  const int64_t work_start = s.work();
  walk_work_ = 1;
  while ((int64_t(1) << walk_work_) < int64_t(s.memory().num_points()) + 1) ++walk_work_;
  y_.resize(C);
  for (int32_t c = 0; c < C; ++c) y_[c] = group_label(s, c);
  // Each group's cost at its current label, then per group edge the best pair by estimate.
  local_cost_.assign(C, 0.0);
  for (int32_t c = 0; c < C; ++c) {
    Cost v = gr_.costs(c)[y_[c]];
    for (int64_t k = gr_.adj_offset[c]; k < gr_.adj_offset[c + 1]; ++k)
      v += gr_.edge_cost(gr_.adj_edge[k], c, y_[c], y_[gr_.adj_other[k]]);
    local_cost_[c] = v;
    s.add_work(1 + gr_.adj_offset[c + 1] - gr_.adj_offset[c]);
  }
  // Labels a group can take without a member breaking the limit on its own (its usage change
  // on top of the profile as it is): a kick to a label that cannot fit is not tried (the
  // cheapest label by the estimate is often the replicated one, 8x the memory).
  fits_.assign(gr_.node_cost.size(), 1);
  if (s.memory().limited()) {
    const MemoryProfile& mp = s.memory();
    for (int32_t c = 0; c < C; ++c) {
      const int32_t* mem = cl_.members.data() + cl_.member_offset[c];
      uint8_t* f = fits_.data() + gr_.label_offset[c];
      for (int32_t k = 0; k < cl_.size(c); ++k) {
        const int32_t m = mem[k];
        if (mp.first(m) >= mp.last(m)) continue;
        const int64_t* u = g_.usages(m);
        const int64_t now = u[s.labels()[m]];
        int64_t room = -1;  // queried once per member, only when some label needs it
        for (int32_t r = 0; r < gr_.labels(c); ++r) {
          const int64_t up = u[cl_.label_of_root[cl_.map_offset[m] + r]] - now;
          if (up <= 0 || !f[r]) continue;
          if (room < 0) {
            room = mp.limit() - mp.max_over(mp.first(m), mp.last(m));
            s.add_work(1);
          }
          if (up > room) f[r] = 0;
        }
      }
    }
  }
  std::vector<Candidate> cand;
  auto by_gain = [](const Candidate& x, const Candidate& z) { return x.gain > z.gain; };
  const Cost tol = 1e-9 * std::max(1.0, std::abs(s.cost()));
  for (int32_t e = 0; e < gr_.num_edges(); ++e) {
    const int32_t a = gr_.edge_a[e], b = gr_.edge_b[e];
    const int32_t Sa = gr_.labels(a), Sb = gr_.labels(b);
    const Cost* m = gr_.edge_matrix(e);
    const Cost current = local_cost_[a] + local_cost_[b] - m[int64_t(y_[a]) * Sb + y_[b]];
    if (is_infeasible(current)) continue;
    const Cost* oa = opt_.data() + gr_.label_offset[a];
    const Cost* ob = opt_.data() + gr_.label_offset[b];
    const Cost* ra = rowmin_.data() + slot_offset_[slot_a_[e]];
    const Cost* rb = rowmin_.data() + slot_offset_[slot_b_[e]];
    const uint8_t* fa = fits_.data() + gr_.label_offset[a];
    const uint8_t* fb = fits_.data() + gr_.label_offset[b];
    edge_cand_.clear();
    for (int32_t r = 0; r < Sa; ++r) {
      if (is_infeasible(oa[r]) || !fa[r]) continue;
      const Cost base = oa[r] - ra[r];
      for (int32_t q = 0; q < Sb; ++q) {
        const Cost entry = m[int64_t(r) * Sb + q];
        if (is_infeasible(entry) || is_infeasible(ob[q]) || (r == y_[a] && q == y_[b]) || !fb[q]) continue;
        const Cost gain = current - (base + ob[q] - rb[q] + entry);
        if (gain > tol) edge_cand_.push_back({gain, e, r, q});
      }
    }
    s.add_work(int64_t(Sa) * Sb);
    const size_t per_edge = std::min(edge_cand_.size(), size_t(kPairsPerEdge));
    std::partial_sort(edge_cand_.begin(), edge_cand_.begin() + per_edge, edge_cand_.end(), by_gain);
    cand.insert(cand.end(), edge_cand_.begin(), edge_cand_.begin() + per_edge);
  }
  const size_t keep = std::min(cand.size(), size_t(max_trials));
  std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(), by_gain);
  int64_t kept = 0;
  for (size_t k = 0; k < keep; ++k) {
    if (Clock::now() > deadline || s.work() - work_start >= max_work) break;
    const Candidate& cd = cand[k];
    const int32_t a = gr_.edge_a[cd.e], b = gr_.edge_b[cd.e];
    // An earlier kick may have moved these groups already.
    if (y_[a] == cd.r && y_[b] == cd.q) continue;
    if (trial(s, a, cd.r, b, cd.q, deadline)) ++kept;
  }
  return kept;
}

}  // namespace autoshard::detail
