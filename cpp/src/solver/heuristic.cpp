#include "autoshard/heuristic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "autoshard/reduce.h"
#include "graph_view.h"
#include "lns_tree.h"
#include "local_search.h"
#include "memory_profile.h"
#include "trws.h"

namespace autoshard {
namespace {

using detail::Clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

SolveResult solve_heuristic(const Problem& problem, const SolveOptions& options) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(std::max(0.0, options.time_limit_s)));
  SolveResult result;
  result.lower_bound = -std::numeric_limits<Cost>::infinity();

  const Reduction red = reduce(problem);
  if (options.verbose)
    std::fprintf(stderr, "[heuristic] reduce: %zu -> %zu nodes, %lld -> %lld strategies "
                 "(infeasible %lld, memory %lld, dominated %lld, eliminated %lld) in %.2fs\n",
                 problem.num_nodes(), red.reduced.num_nodes(), (long long)red.stats.strategies_before,
                 (long long)red.stats.strategies_after, (long long)red.stats.infeasible_removed,
                 (long long)red.stats.memory_removed, (long long)red.stats.dominated_removed,
                 (long long)red.stats.nodes_eliminated, red.stats.seconds);
  if (red.infeasible) {
    result.status = "infeasible: " + red.infeasible_reason;
    result.lower_bound = std::numeric_limits<Cost>::infinity();
    result.total_time_s = seconds_since(t0);
    return result;
  }

  const detail::GraphView g = detail::build_graph_view(red.reduced);
  detail::MemoryProfile memory(g, red.reduced.usage_limit);
  detail::PlanState state(g, memory);
  const detail::Clusters clusters = detail::find_clusters(g);
  detail::Trws trws(g);
  trws.set_clusters(&clusters);
  detail::TreeLns lns(g, clusters);
  std::mt19937_64 rng(options.seed);
  std::vector<Cost> price(g.node_cost.size(), 0.0);
  const int32_t T = memory.num_points();
  const double limit = double(red.reduced.usage_limit);
  std::vector<double> lambda(T, 0.0), prefix(T + 1, 0.0);
  std::vector<Cost> unary(g.node_cost.size());
  std::vector<int32_t> labeling, best_x;
  std::vector<int64_t> profile, repair_profile;
  std::vector<double> boost(T, 0.0);
  std::vector<Cost> boosted(g.node_cost.size());
  std::vector<int32_t> repaired;
  // Smallest repair penalty per unit of usage and time point: tiny against the costs, then
  // doubled until the plan fits.
  double boost_unit = 1e-12, boost_cap = 1e300;
  detail::Trws repair_trws(g);
  repair_trws.set_clusters(&clusters);
  {
    double cost_scale = 0, usage_scale = 0;
    for (Cost c : g.node_cost) if (!is_infeasible(c)) cost_scale = std::max(cost_scale, std::abs(c));
    for (int64_t u : g.usage) usage_scale = std::max(usage_scale, double(u));
    if (usage_scale > 0) boost_unit = std::max(1e-12, 1e-6 * cost_scale / usage_scale);
    // Penalties must stay far below the infeasible-entry cost, or they would outweigh it.
    if (usage_scale > 0) boost_cap = 1e14 / usage_scale / std::max<int32_t>(1, T);
  }
  Cost best_cost = std::numeric_limits<Cost>::infinity();
  Cost best_bound = -std::numeric_limits<Cost>::infinity();
  double step_scale = 1.0;
  bool primal_phase = false;
  // Time for tree LNS after each polished plan: a share of the limit, at least 0.2 s.
  const int64_t lns_ms = std::max<int64_t>(200, int64_t(options.time_limit_s * 1000 / 60));
  double target_gap = 0.15;  // Polyak target above the bound; shrinks as the bound stalls
  int rounds_without_bound_gain = 0;

  for (int round = 0; Clock::now() < deadline; ++round) {
    // Unaries: node cost plus usage times the summed multipliers over the node's live points.
    double lambda_sum = 0;
    for (int32_t t = 0; t < T; ++t) {
      prefix[t + 1] = prefix[t] + lambda[t];
      lambda_sum += lambda[t];
    }
    for (int32_t i = 0; i < g.num_nodes; ++i) {
      const double pen = prefix[memory.last(i)] - prefix[memory.first(i)];
      const int64_t off = g.label_offset[i];
      for (int32_t s = 0; s < g.labels(i); ++s) unary[off + s] = g.node_cost[off + s] + pen * double(g.usage[off + s]);
    }
    trws.set_unary(unary);
    const int iterations = round == 0 ? 10 : 5;
    for (int k = 0; k < iterations && Clock::now() < deadline; ++k) trws.iterate(labeling);
    if (labeling.empty()) break;
    // Valid for any multipliers >= 0: every valid plan has penalised cost <= cost + sum(lambda) * limit.
    const Cost bound = trws.lower_bound() - (memory.limited() ? lambda_sum * limit : 0.0);
    if (!std::isfinite(best_bound) || bound > best_bound + 1e-9 * std::abs(best_bound)) {
      best_bound = bound;
      rounds_without_bound_gain = 0;
    } else if (++rounds_without_bound_gain >= 5) {
      step_scale *= 0.5;
      target_gap = std::max(0.02, target_gap * 0.7);
      rounds_without_bound_gain = 0;
    }

    state.reset(labeling);
    memory.values(profile);
    // Repair, then improve by local search, and keep the plan when it is the best so far.
    auto polish = [&](const char* how) -> bool {
      const int64_t peak_before = memory.peak();
      const Cost cost_before = state.cost();
      if (!lns.repair(state, deadline)) {
        if (options.verbose)
          std::fprintf(stderr, "[heuristic]   %s: peak %lld cost %.6g, repair failed\n", how,
                       (long long)peak_before, cost_before);
        return false;
      }
      const Cost cost_repaired = state.cost();
      for (int pass = 0; pass < 10 && Clock::now() < deadline; ++pass) {
        const int64_t single = state.descend(deadline);
        const int64_t grouped = state.descend_clusters(deadline, clusters);
        const int64_t ejected = state.descend_ejection(deadline, clusters);
        if (single + grouped + ejected == 0) break;
      }
      const Cost cost_descended = state.cost();
      // Tree LNS priced with the current multipliers, then a last single-move descent.
      for (size_t k = 0; k < price.size(); ++k) price[k] = unary[k] - g.node_cost[k];
      lns.set_prices(price);
      const auto lns_deadline = std::min(deadline, Clock::now() + std::chrono::milliseconds(lns_ms));
      const int64_t lns_moves = lns.run(state, lns_deadline, 1 << 30, 48, rng);
      state.descend(deadline);
      if (options.verbose)
        std::fprintf(stderr, "[heuristic]   %s: peak %lld cost %.6g, repaired %.6g, descended %.6g, lns %lld -> %.6g\n",
                     how, (long long)peak_before, cost_before, cost_repaired, cost_descended,
                     (long long)lns_moves, state.cost());
      // The running cost is incremental; the recorded one is recomputed exactly.
      if (state.valid() && state.cost() < best_cost && detail::graph_cost(g, state.labels()) < best_cost) {
        best_cost = detail::graph_cost(g, state.labels());
        best_x = state.labels();
        if (result.time_to_first_s < 0) result.time_to_first_s = seconds_since(t0);
      }
      return true;
    };
    const double decoded_peak = double(memory.peak());
    const double limit_d = double(red.reduced.usage_limit);
    // Over the limit by a little: the greedy group repair of the decoded plan loses least.
    // Far over (early multipliers), or when that repair fails: re-decode with penalties pushed
    // up where the limit breaks.
    const bool near = !memory.limited() || decoded_peak <= 1.3 * limit_d;
    bool polished = false;
    if (near || best_x.empty()) polished = polish("direct");
    if (!polished && memory.limited() && decoded_peak > limit_d && (best_x.empty() || near)) {
      state.reset(labeling);
      {
      // Stay close to the multipliers' own plan: scale them up a little each attempt and add a
      // growing extra penalty only where the limit still breaks. Too strong a push would
      // over-shrink memory and give away cost elsewhere.
      std::fill(boost.begin(), boost.end(), 0.0);
      double mean_lambda = 0;
      int32_t positive = 0;
      for (int32_t t = 0; t < T; ++t) if (lambda[t] > 0) { mean_lambda += lambda[t]; ++positive; }
      const double unit = positive ? 0.05 * mean_lambda / positive : boost_unit;
      double scale = 1.0;
      for (int attempt = 0; attempt < 10 && !state.memory_ok() && Clock::now() < deadline; ++attempt) {
        memory.values(repair_profile);
        scale *= 1.15;
        for (int32_t t = 0; t < T; ++t)
          if (repair_profile[t] > red.reduced.usage_limit) boost[t] = std::min(boost_cap, std::max(2.0 * boost[t], unit));
        double run = 0;
        for (int32_t t = 0; t < T; ++t) prefix[t + 1] = (run += scale * lambda[t] + boost[t]);
        for (int32_t i = 0; i < g.num_nodes; ++i) {
          const double pen = prefix[memory.last(i)] - prefix[memory.first(i)];
          const int64_t off = g.label_offset[i];
          for (int32_t s = 0; s < g.labels(i); ++s)
            boosted[off + s] = g.node_cost[off + s] + pen * double(g.usage[off + s]);
        }
        // A second message passer tracks the boosted costs, so early nodes see what the boost
        // does to later ones (decoding alone with stale messages cannot coordinate them).
        repair_trws.set_unary(boosted);
        repair_trws.iterate(repaired);
        state.reset(repaired);
      }
    }
      polish("penalised");
    }
    if (options.verbose)
      std::fprintf(stderr, "[heuristic] round %d t=%.1fs bound %.6g best %.6g decoded peak %lld / %lld step %.3g\n",
                   round, seconds_since(t0), best_bound + red.cost_offset, best_cost + red.cost_offset,
                   (long long)(profile.empty() ? 0 : *std::max_element(profile.begin(), profile.end())),
                   (long long)red.reduced.usage_limit, step_scale);
    if (!best_x.empty() && best_cost - best_bound <= 1e-9 * std::abs(best_cost)) break;  // proven
    if (!memory.limited() || T == 0) {
      continue;  // no multipliers to move: keep passing messages
    }
    // Two phases. First, projected subgradient steps (Polyak) raise the lower bound quickly.
    // Once the bound stalls (or a third of the time is gone), gentle multiplicative "adaptive
    // penalty" updates keep the decoded plans near the limit, where the best plans are; the
    // bound stays valid for any multipliers >= 0.
    if (!primal_phase && (step_scale < 0.3 || seconds_since(t0) > options.time_limit_s / 3)) primal_phase = true;
    if (!primal_phase) {
      // Polyak target: the best plan, but at most target_gap above the bound (a poor early
      // plan would make the steps far too long and the multipliers oscillate).
      const double target = std::min(std::isfinite(best_cost) ? best_cost : std::numeric_limits<double>::infinity(),
                                     bound + target_gap * std::abs(bound) + 1.0);
      double norm2 = 0;
      for (int32_t t = 0; t < T; ++t) {
        const double sg = double(profile[t]) - limit;
        if (lambda[t] > 0 || sg > 0) norm2 += sg * sg;
      }
      if (norm2 > 0) {
        const double step = step_scale * std::max(target - bound, 1e-6 * std::abs(target)) / norm2;
        for (int32_t t = 0; t < T; ++t) lambda[t] = std::max(0.0, lambda[t] + step * (double(profile[t]) - limit));
      }
    } else {
      double mean_lambda = 0;
      int32_t positive = 0;
      for (int32_t t = 0; t < T; ++t) if (lambda[t] > 0) { mean_lambda += lambda[t]; ++positive; }
      const double unit = positive ? 0.02 * mean_lambda / positive : boost_unit;
      for (int32_t t = 0; t < T; ++t) {
        const double rel = (double(profile[t]) - limit) / limit;
        if (rel > 0) lambda[t] = std::max(lambda[t], unit);
        lambda[t] *= std::clamp(1.0 + 0.5 * rel, 0.8, 1.3);
      }
    }
  }

  result.lower_bound = best_bound + red.cost_offset;
  if (!best_x.empty()) {
    result.found = true;
    result.solution = red.expand(best_x);
    result.cost = best_cost + red.cost_offset;
    state.reset(best_x);
    result.peak_usage = memory.peak();
    result.proven_optimal = result.cost - result.lower_bound <= 1e-9 * std::abs(result.cost);
    result.status = result.proven_optimal ? "optimal" : "time limit";
  } else {
    result.status = "no valid plan found within the time limit";
  }
  result.total_time_s = seconds_since(t0);
  return result;
}

}  // namespace autoshard
