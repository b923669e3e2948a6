#include "heuristic/lagrangian_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "heuristic/lns_tree.h"
#include "heuristic/memory_profile.h"
#include "heuristic/pair_kick.h"
#include "heuristic/trws.h"

namespace autoshard::detail {
namespace {

// Work of one forward plus backward TRW-S sweep in PlanState::work units (matrix entries and
// node terms read), so message passing and polishing are measured on one scale.
int64_t sweep_work(const GraphView& g) {
  int64_t w = 0;
  for (int64_t e = 0; e < g.num_edges(); ++e) w += 2 * int64_t(g.labels(g.edge_a[e])) * g.labels(g.edge_b[e]);
  for (int32_t i = 0; i < g.num_nodes; ++i) w += 3 * int64_t(g.labels(i)) * (1 + g.adj_offset[i + 1] - g.adj_offset[i]);
  return w;
}

// Tree-LNS work after each polished plan, in TRW-S sweeps.
constexpr int64_t kLnsSweeps = 50;
constexpr double kLnsTimeShare = 0.1;   // of the whole time limit, per tree LNS
constexpr int32_t kKickTrials = 2048;   // pair kicks per kick round (pair_kick.h)
constexpr int64_t kKickSweeps = 15;     // kick work per polish, in TRW-S sweeps
constexpr double kKickNearBest = 0.02;  // kicks only for plans at most this much above the best
// A decode at most this many times the limit is polished directly; polishing the ones
// further over spends the polish share on plans whose repair gives away most of what they
// save: 1.3 -> 1.1 gave public S 1,530,438,233 -> 1,524,348,634 and S-memmid 1,760,721,339 ->
// 1,755,630,291 at 25 % (--work-limit 3e10, 2 threads), A, L, P and L-memmid the same plans.
constexpr double kNearPeak = 1.1;
// The adaptive penalty's step per unit of relative excess where the decoded plan breaks the
// limit, and per unit of relative room where it leaves some. Up is steeper: a decode a few
// percent over the limit costs far more to repair than a few percent of room gives away, and
// at 0.5 up the multipliers of S-memmid rose 2.3 % a round at 4.6 % over, so for 200 rounds the
// decodes stayed there and their repair added 20 % to their cost. 0.5 -> 8 at --work-limit
// 2e10, 2 threads: S-memmid 1,751,768,792 -> 1,701,302,967 (bound 1.517e9 -> 1.639e9), public S
// 1,534,115,732 -> 1,513,445,866, L-mem1.1 1,944,929,133 -> 1,934,236,392; 4 and 16 were
// within 0.5 % of 8 on all three.
constexpr double kRaiseGain = 8.0;
constexpr double kLowerGain = 0.5;

class Search {
 public:
  Search(const GraphView& g, const Clusters& clusters, int64_t usage_limit, const SearchConfig& config,
         const SearchStop& stop, Cost cost_offset)
      : g_(g),
        clusters_(clusters),
        config_(config),
        stop_(stop),
        cost_offset_(cost_offset),
        memory_(g, usage_limit),
        state_(g, memory_),
        trws_(g, config.reverse_sweeps),
        repair_trws_(g, config.reverse_sweeps),
        lns_(g, clusters),
        kick_(g, clusters, lns_.groups()),
        rng_(config.seed),
        T_(memory_.num_points()),
        limit_(double(usage_limit)),
        lambda_(T_, 0.0),
        prefix_(T_ + 1, 0.0),
        boost_(T_, 0.0),
        one_sweep_(sweep_work(g)) {
    trws_.set_clusters(&clusters);
    repair_trws_.set_clusters(&clusters);
    // Smallest penalty per unit of usage and time point: tiny against the costs, then grown
    // until the plan fits; capped far below the infeasible-entry cost it must never outweigh.
    double cost_scale = 0, usage_scale = 0;
    for (Cost c : g.node_cost)
      if (!is_infeasible(c)) cost_scale = std::max(cost_scale, std::abs(c));
    for (int64_t u : g.usage) usage_scale = std::max(usage_scale, double(u));
    if (usage_scale > 0) {
      boost_unit_ = std::max(1e-12, 1e-6 * cost_scale / usage_scale);
      boost_cap_ = 1e14 / usage_scale / std::max<int32_t>(1, T_);
    }
    // Budgets that can bind get a multiplier each for their high and low bound.
    for (size_t k = 0; k < g.budgets.size(); ++k) {
      if (budget_can_bind(g, k)) budget_index_.push_back(int32_t(k));
    }
    mu_high_.assign(budget_index_.size(), 0.0);
    mu_low_.assign(budget_index_.size(), 0.0);
    for (int32_t k : budget_index_) {
      double scale = 0;
      for (int64_t u : g.budgets[k].usage) scale = std::max(scale, double(u));
      budget_unit_.push_back(scale > 0 ? std::max(1e-12, 1e-6 * cost_scale / scale) : 1e-12);
    }
  }

  SearchOutcome run();

 private:
  const GraphView& g_;
  const Clusters& clusters_;
  const SearchConfig config_;
  const SearchStop stop_;
  const Cost cost_offset_;
  MemoryProfile memory_;
  PlanState state_;
  Trws trws_, repair_trws_;
  TreeLns lns_;
  PairKick kick_;
  std::mt19937_64 rng_;
  const int32_t T_;
  const double limit_;
  std::vector<double> lambda_, prefix_, boost_;
  // Lagrange multipliers of the budgets that can bind (budget_index_): >= 0 on sum <= high
  // and on sum >= low; their penalty is (mu_high - mu_low) * budget usage per label.
  std::vector<int32_t> budget_index_;
  std::vector<double> mu_high_, mu_low_, budget_unit_;
  std::vector<int64_t> budget_sums_;
  std::vector<Cost> unary_, boosted_, price_;
  std::vector<int32_t> labeling_, repaired_;
  std::vector<int64_t> profile_, repair_profile_;
  double boost_unit_ = 1e-12, boost_cap_ = 1e300;
  const int64_t one_sweep_;
  int64_t dual_work_ = 0;
  int over_rounds_ = 0;  // rounds in a row whose decode broke the memory limit
  Clock::time_point t0_ = Clock::now();
  SearchOutcome out_;

  Cost best_cost() const { return out_.best.empty() ? std::numeric_limits<Cost>::infinity() : out_.best_cost; }
  int64_t work() const { return dual_work_ + state_.work(); }
  bool out_of_budget() const {
    return Clock::now() >= stop_.deadline || (stop_.work_limit > 0 && work() >= stop_.work_limit) ||
           (stop_.proven && stop_.proven->load());
  }
  // prefix_ = running sums of lambda (scaled) plus boost; unary = costs + usage * live sum.
  void penalised_costs(double lambda_scale, bool with_boost, std::vector<Cost>& out);
  bool polish(const char* how, bool with_lns = true);
  void redecode_with_boost();
  void update_multipliers(bool primal_phase, Cost bound, double step_scale, double target_gap);
  void scale_memory_multipliers(double lowest);
  double mean_positive_lambda() const;
  bool has_budgets() const { return !budget_index_.empty(); }
  // Time points whose multipliers move (none without a memory limit).
  int32_t mem_points() const { return memory_.limited() ? T_ : 0; }
  // The constant of the budget terms in the dual: sum mu_high * high - mu_low * low.
  double budget_offset() const;
  void budget_sums(const std::vector<int32_t>& x, std::vector<int64_t>& out) const;
};

void Search::penalised_costs(double lambda_scale, bool with_boost, std::vector<Cost>& out) {
  double run = 0;
  for (int32_t t = 0; t < T_; ++t) prefix_[t + 1] = (run += lambda_scale * lambda_[t] + (with_boost ? boost_[t] : 0.0));
  out.resize(g_.node_cost.size());
  for (int32_t i = 0; i < g_.num_nodes; ++i) {
    const double pen = prefix_[memory_.last(i)] - prefix_[memory_.first(i)];
    const int64_t off = g_.label_offset[i];
    for (int32_t s = 0; s < g_.labels(i); ++s) out[off + s] = g_.node_cost[off + s] + pen * double(g_.usage[off + s]);
  }
  for (size_t b = 0; b < budget_index_.size(); ++b) {
    const double mu = lambda_scale * (mu_high_[b] - mu_low_[b]);
    if (mu == 0) continue;
    const auto& u = g_.budgets[budget_index_[b]].usage;
    for (size_t k = 0; k < out.size(); ++k) out[k] += mu * double(u[k]);
  }
}

double Search::budget_offset() const {
  double off = 0;
  for (size_t b = 0; b < budget_index_.size(); ++b) {
    const auto& bud = g_.budgets[budget_index_[b]];
    off += mu_high_[b] * double(bud.high) - mu_low_[b] * double(bud.low);
  }
  return off;
}

void Search::budget_sums(const std::vector<int32_t>& x, std::vector<int64_t>& out) const {
  out.assign(budget_index_.size(), 0);
  for (size_t b = 0; b < budget_index_.size(); ++b) {
    const auto& u = g_.budgets[budget_index_[b]].usage;
    for (int32_t i = 0; i < g_.num_nodes; ++i) out[b] += u[g_.label_offset[i] + x[i]];
  }
}

double Search::mean_positive_lambda() const {
  double sum = 0;
  int32_t positive = 0;
  for (double l : lambda_)
    if (l > 0) {
      sum += l;
      ++positive;
    }
  return positive ? sum / positive : 0.0;
}

// Repair, then improve by local search, and keep the plan when it is the best so far.
// Without the tree LNS (about 50 sweeps of work, 10-30x the rest) it is a quick polish.
bool Search::polish(const char* how, bool with_lns) {
  const auto deadline = stop_.deadline;
  const int64_t peak_before = memory_.peak();
  const Cost cost_before = state_.cost();
  const auto t_start = Clock::now();
  if (!lns_.repair(state_, deadline)) {
    if (config_.verbose)
      std::fprintf(stderr, "[search %d]   %s: peak %lld cost %.6g, repair failed\n", config_.id, how,
                   (long long)peak_before, cost_before);
    return false;
  }
  const Cost cost_repaired = state_.cost();
  const auto t_repaired = Clock::now();
  state_.descend_all(deadline, clusters_);
  const Cost cost_descended = state_.cost();
  const auto t_descended = Clock::now();
  // Tree LNS priced with the current multipliers, then a last single-move descent.
  price_.resize(g_.node_cost.size());
  for (size_t k = 0; k < price_.size(); ++k) price_[k] = unary_[k] - g_.node_cost[k];
  lns_.set_prices(price_);
  int64_t lns_moves = 0;
  // A descended plan already within the gap tolerance of the proven bound ends the search
  // this round whatever the tree LNS finds, and the LNS could gain less than the tolerance:
  // it is skipped (on Llama-3-8B's planner problem it was a third of the whole planning time).
  const bool within_gap =
      config_.gap_tolerance > 0 && state_.valid() && std::isfinite(out_.lower_bound) &&
      state_.cost() - out_.lower_bound <= config_.gap_tolerance * std::abs(state_.cost() + cost_offset_);
  if (with_lns && !within_gap) {
    // The LNS's work budget is counted in sweeps; on clock-limited runs it also gets at most
    // a share of the whole time. Its 50 sweeps took 25.7 s of a 28 s limit on Llama-3-405B's
    // tied planner problem (3-D mesh, tables up to 470 x 940), where the next three rounds
    // reached the optimum in 3.5 s.
    auto lns_deadline = deadline;
    if (stop_.work_limit <= 0) {
      const double whole = to_seconds(deadline - t0_);
      lns_deadline = std::min(deadline, Clock::now() + from_seconds(kLnsTimeShare * whole));
    }
    lns_moves = lns_.run(state_, lns_deadline, int64_t(1) << 40, config_.lns_tree_size, rng_, kLnsSweeps * one_sweep_);
    state_.descend(deadline);
  }
  // Pair kicks (pair_kick.h) leave the local optimum of all the moves above, but only for a
  // plan about as good as the best: their work counts against the polish share, and on public
  // L kicking every polished plan (most 7 % above the best) delayed the polish of the decode
  // that led to its best plan (2.09e9 instead of 1.98e9 at the same work).
  const Cost cost_lns = state_.cost();
  int64_t kicks = 0;
  const auto t_kicks = Clock::now();
  const bool near_best = out_.best.empty() || state_.cost() <= best_cost() + kKickNearBest * std::abs(best_cost());
  if (with_lns && !within_gap && near_best && state_.valid()) {
    const int64_t kick_start = state_.work();
    for (int round = 0; round < 5 && Clock::now() < deadline; ++round) {
      const int64_t left = kKickSweeps * one_sweep_ - (state_.work() - kick_start);
      if (left <= 0) break;
      const int64_t k = kick_.run(state_, deadline, kKickTrials, left);
      kicks += k;
      if (k == 0) break;
      state_.descend(deadline);
      state_.descend_clusters(deadline, clusters_);
    }
  }
  if (config_.verbose)
    std::fprintf(stderr,
                 "[search %d]   %s: peak %lld cost %.6g, repaired %.6g, descended %.6g, lns %lld -> %.6g, "
                 "kicks %lld -> %.6g (%.2f + %.2f + %.2f + %.2f s)\n",
                 config_.id, how, (long long)peak_before, cost_before, cost_repaired, cost_descended,
                 (long long)lns_moves, cost_lns, (long long)kicks, state_.cost(), to_seconds(t_repaired - t_start),
                 to_seconds(t_descended - t_repaired), to_seconds(t_kicks - t_descended), seconds_since(t_kicks));
  // The running cost is incremental; the recorded one is recomputed exactly.
  if (state_.valid() && state_.cost() < best_cost()) {
    const Cost exact = graph_cost(g_, state_.labels());
    if (exact < best_cost()) {
      out_.best = state_.labels();
      out_.best_cost = exact;
      if (out_.time_to_first_s < 0) out_.time_to_first_s = seconds_since(t0_);
    }
  }
  return true;
}

// Far over the limit (early multipliers), or when the direct repair failed: re-decode with
// the multipliers scaled up a little each attempt plus a growing extra penalty only where the
// limit still breaks. Too strong a push would over-shrink memory and give away cost elsewhere.
void Search::redecode_with_boost() {
  state_.reset(labeling_);
  std::fill(boost_.begin(), boost_.end(), 0.0);
  const double mean = mean_positive_lambda();
  const double unit = mean > 0 ? 0.05 * mean : boost_unit_;
  double scale = 1.0;
  for (int attempt = 0; attempt < 10 && !state_.memory_ok() && Clock::now() < stop_.deadline; ++attempt) {
    memory_.values(repair_profile_);
    scale *= 1.15;
    for (int32_t t = 0; t < T_; ++t)
      if (double(repair_profile_[t]) > limit_) boost_[t] = std::min(boost_cap_, std::max(2.0 * boost_[t], unit));
    penalised_costs(scale, true, boosted_);
    // A second message passer tracks the boosted costs, so early nodes see what the boost
    // does to later ones (decoding alone with stale messages cannot coordinate them).
    repair_trws_.set_unary(boosted_);
    repair_trws_.iterate(repaired_);
    dual_work_ += 2 * one_sweep_;
    state_.reset(repaired_);
  }
}

// The multiplicative "adaptive penalty" update of the memory multipliers: up by up to 30 %
// where the decoded plan breaks the limit (from at least `unit`), down to `lowest` x where it
// leaves room. The bound stays valid for any multipliers >= 0.
void Search::scale_memory_multipliers(double lowest) {
  const double mean = mean_positive_lambda();
  const double unit = mean > 0 ? 0.02 * mean : boost_unit_;
  for (int32_t t = 0; t < mem_points(); ++t) {
    const double rel = (double(profile_[t]) - limit_) / limit_;
    if (rel > 0) lambda_[t] = std::max(lambda_[t], unit);
    lambda_[t] *= std::clamp(1.0 + (rel > 0 ? kRaiseGain : kLowerGain) * rel, lowest, 1.3);
  }
}

// Two phases. First, projected subgradient steps (Polyak) raise the lower bound quickly. Once
// the bound stalls, gentle multiplicative "adaptive penalty" updates keep the decoded plans
// near the limit, where the best plans are; the bound stays valid for any multipliers >= 0.
void Search::update_multipliers(bool primal_phase, Cost bound, double step_scale, double target_gap) {
  if (!primal_phase) {
    // Polyak target: the best plan, but at most target_gap above the bound (a poor early
    // plan would make the steps far too long and the multipliers oscillate).
    const double target = std::min(best_cost(), bound + target_gap * std::abs(bound) + 1.0);
    double norm2 = 0;
    for (int32_t t = 0; t < mem_points(); ++t) {
      const double sg = double(profile_[t]) - limit_;
      if (lambda_[t] > 0 || sg > 0) norm2 += sg * sg;
    }
    for (size_t b = 0; b < budget_index_.size(); ++b) {
      const auto& bud = g_.budgets[budget_index_[b]];
      const double over = double(budget_sums_[b]) - double(bud.high), under = double(bud.low) - double(budget_sums_[b]);
      if (mu_high_[b] > 0 || over > 0) norm2 += over * over;
      if (mu_low_[b] > 0 || under > 0) norm2 += under * under;
    }
    if (norm2 <= 0) return;
    const double step = step_scale * std::max(target - bound, 1e-6 * std::abs(target)) / norm2;
    for (int32_t t = 0; t < mem_points(); ++t)
      lambda_[t] = std::max(0.0, lambda_[t] + step * (double(profile_[t]) - limit_));
    for (size_t b = 0; b < budget_index_.size(); ++b) {
      const auto& bud = g_.budgets[budget_index_[b]];
      mu_high_[b] = std::max(0.0, mu_high_[b] + step * (double(budget_sums_[b]) - double(bud.high)));
      mu_low_[b] = std::max(0.0, mu_low_[b] + step * (double(bud.low) - double(budget_sums_[b])));
    }
    return;
  }
  scale_memory_multipliers(0.8);
  for (size_t b = 0; b < budget_index_.size(); ++b) {
    const auto& bud = g_.budgets[budget_index_[b]];
    const double sum = double(budget_sums_[b]);
    const double over = (sum - double(bud.high)) / std::max(1.0, double(bud.high));
    const double under = (double(bud.low) - sum) / std::max(1.0, double(bud.low));
    const double mu_unit = std::max(budget_unit_[b], 0.02 * std::max(mu_high_[b], mu_low_[b]));
    if (bud.high < std::numeric_limits<int64_t>::max()) {
      if (over > 0) mu_high_[b] = std::max(mu_high_[b], mu_unit);
      mu_high_[b] *= std::clamp(1.0 + 0.5 * over, 0.8, 1.3);
    }
    if (bud.low > 0) {
      if (under > 0) mu_low_[b] = std::max(mu_low_[b], mu_unit);
      mu_low_[b] *= std::clamp(1.0 + 0.5 * under, 0.8, 1.3);
    }
  }
}

SearchOutcome Search::run() {
  t0_ = Clock::now();
  out_.lower_bound = -std::numeric_limits<Cost>::infinity();
  // Polyak target above the bound; both shrink as the bound stalls
  double step_scale = config_.first_step_scale, target_gap = config_.first_target_gap;
  int rounds_without_bound_gain = 0;
  int64_t last_gain_round = 0;  // the last round that improved the bound or the plan
  Cost best_seen = best_cost();
  bool primal_phase = false;
  const bool limited = memory_.limited();
  for (int64_t round = 0;; ++round) {
    if (out_of_budget()) {
      out_.stopped_by = Clock::now() >= stop_.deadline                         ? "time limit"
                        : (stop_.work_limit > 0 && work() >= stop_.work_limit) ? "work limit"
                                                                               : "another run's proof";
      break;
    }
    out_.rounds = round + 1;
    penalised_costs(1.0, false, unary_);
    const double lambda_sum = prefix_[T_];
    trws_.set_unary(unary_);
    const int iterations = round == 0 ? 10 : 5;
    for (int k = 0; k < iterations && Clock::now() < stop_.deadline; ++k) trws_.iterate(labeling_);
    dual_work_ += (iterations + 1) * one_sweep_;
    if (labeling_.empty()) break;
    // Valid for any multipliers >= 0: every valid plan has penalised cost <= cost + sum(lambda) * limit
    // + sum(mu_high * high - mu_low * low).
    const Cost bound = trws_.lower_bound() - (limited ? lambda_sum * limit_ : 0.0) - budget_offset();
    if (!std::isfinite(out_.lower_bound) || bound > out_.lower_bound + 1e-9 * std::abs(out_.lower_bound)) {
      // Stalled means no gain worth a round: creeping by a millionth does not count.
      if (!std::isfinite(out_.lower_bound) || bound > out_.lower_bound + 1e-6 * std::abs(out_.lower_bound))
        last_gain_round = round;
      out_.lower_bound = bound;
      rounds_without_bound_gain = 0;
    } else if (++rounds_without_bound_gain >= 5) {
      step_scale *= 0.5;
      target_gap = std::max(0.02, target_gap * 0.7);
      rounds_without_bound_gain = 0;
    }

    state_.reset(labeling_);
    memory_.values(profile_);
    if (has_budgets()) budget_sums(labeling_, budget_sums_);
    const double share = primal_phase ? config_.polish_share_primal : config_.polish_share_dual;
    const bool polish_now = out_.best.empty() || double(state_.work()) * (1 - share) <= share * double(dual_work_);
    const double decoded_peak = double(memory_.peak());
    // Over the limit by a little: the greedy group repair of the decoded plan loses least.
    const bool near = !limited || decoded_peak <= kNearPeak * limit_;
    over_rounds_ = decoded_peak > limit_ ? over_rounds_ + 1 : 0;
    const Cost decoded_cost = state_.cost();
    if (polish_now) {
      // A first plan decoded far over the memory limit (round 0's multipliers know nothing of
      // the limit yet) gets repair and descent only. Its tree LNS would cost ~50 sweeps (2.5-3.8 s
      // on C-mem0.97, where it improved nothing on the repaired plan), and since the schedule
      // charges polishing work against the share, it also held off the next polish for ~17
      // rounds, past the near decodes of rounds 1-5 whose polish gives the first good plan.
      // A first decode near the limit keeps the full polish (skipping it cost public A 0.3 %
      // at its contest limit).
      const bool with_lns = !out_.best.empty() || near;
      bool polished = false;
      if (near || out_.best.empty()) polished = polish(with_lns ? "direct" : "first", with_lns);
      if (!polished && limited && decoded_peak > limit_ && (out_.best.empty() || near)) {
        redecode_with_boost();
        polish("penalised", with_lns);
      }
    } else if (!out_.best.empty() && decoded_cost < out_.best_cost && state_.memory_ok()) {
      // Between full polishes the multipliers often decode a plan that fits the memory limit
      // and already beats the best. Waiting for the work share to allow a full polish let such
      // plans pass unseen: on C-perturb round 8's decode fitted and was 23 % below the best,
      // and the next full polish came 26 rounds later. Repair (for budgets) and descent are
      // cheap next to the tree LNS, so these plans are taken at once. A decode over the limit
      // is not: its greedy repair gives away more than it gains (public C: 4 % over, +7 %).
      polish("quick", false);
    }
    if (config_.verbose) {
      std::fprintf(stderr,
                   "[search %d] round %lld t=%.1fs (%.1fs left) bound %.6g best %.6g decoded cost %.6g peak %lld / "
                   "%lld step %.3g",
                   config_.id, (long long)round, seconds_since(t0_), to_seconds(stop_.deadline - Clock::now()),
                   out_.lower_bound + cost_offset_, best_cost() + cost_offset_, decoded_cost + cost_offset_,
                   (long long)decoded_peak, (long long)limit_, step_scale);
      for (size_t b = 0; b < budget_index_.size(); ++b)
        std::fprintf(stderr, " budget %lld mu %.3g/%.3g", (long long)budget_sums_[b], mu_high_[b], mu_low_[b]);
      std::fprintf(stderr, "\n");
    }
    if (!out_.best.empty() && bound_proves_optimal(out_.best_cost, out_.lower_bound, config_.integer_costs)) {
      out_.stopped_by = "proven optimal";
      if (stop_.proven) stop_.proven->store(true);
      break;
    }
    if (!out_.best.empty() && config_.gap_tolerance > 0 &&
        out_.best_cost - out_.lower_bound <= config_.gap_tolerance * std::abs(out_.best_cost + cost_offset_)) {
      out_.stopped_by = "gap tolerance";
      if (stop_.proven) stop_.proven->store(true);
      break;
    }
    if (best_cost() < best_seen) {
      best_seen = best_cost();
      last_gain_round = round;
    }
    if (config_.stall_rounds > 0 && round - last_gain_round >= config_.stall_rounds) {
      out_.stopped_by = "stalled";
      break;
    }
    if ((!limited || T_ == 0) && !has_budgets()) continue;  // no multipliers to move: keep passing messages
    if (!primal_phase && step_scale < 0.3) primal_phase = true;
    update_multipliers(primal_phase, bound, step_scale, target_gap);
    // Decodes that keep breaking the limit in the dual phase: the subgradient steps alone can
    // leave them there for long. On L-memmid (the limit halfway between the least-usage peak
    // and a good plan's) they stayed at 4.8x the limit for 160 rounds, then at 1.065x for 100,
    // while the bound crept up; nothing near the limit was decoded, so nothing better than
    // 2.129e9 was polished before 33 s. Pushing the multipliers up where the limit breaks
    // gave 2.015e9 at 7.9 s. Only some portfolio runs push: on public S, whose best plans are
    // repaired from decodes 2-12 % over the limit near the dual optimum, pushing in run 0
    // lost 0.27 % at a quarter of its limit.
    if (!primal_phase && config_.push_after_over_rounds > 0 && over_rounds_ >= config_.push_after_over_rounds)
      scale_memory_multipliers(1.0);
  }
  out_.work = work();
  return out_;
}

}  // namespace

SearchOutcome lagrangian_search(const GraphView& g, const Clusters& clusters, int64_t usage_limit,
                                const SearchConfig& config, const SearchStop& stop, Cost cost_offset) {
  const auto t = Clock::now();
  Search search(g, clusters, usage_limit, config, stop, cost_offset);
  if (config.verbose) std::fprintf(stderr, "[search %d] set up in %.2fs\n", config.id, seconds_since(t));
  return search.run();
}

}  // namespace autoshard::detail
