// The anytime solver for large problems: reduce once, then run one Lagrangian search per
// thread on the shared reduced graph (a portfolio: each run has its own seed and schedule)
// and keep the best plan and the best bound. No run reads another's state while it works,
// so the result depends only on the problem, the options and the thread count (and, with no
// work limit, on where the clock stopped the runs). A small reduced problem also gets the
// MILP (milp.h): after the search's share of the time with one thread, as a portfolio member
// beside the searches with more; a proof by either stops the other, and a MILP that stops early
// leaves the rest of the time to one more search.
#include "autoshard/heuristic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>

#include "autoshard/evaluate.h"
#include "autoshard/reduce.h"
#include "heuristic/graph_clusters.h"
#include "graph_view.h"
#include "heuristic/lagrangian_search.h"
#include "heuristic/milp.h"

namespace autoshard {
namespace {

using detail::Clock;
using detail::seconds_since;

// Run k of a portfolio: run 0 is the tuned default; the others change the seed (the LNS
// neighbourhoods) and lean more or less on polishing, so they explore different plans.
detail::SearchConfig portfolio_config(const SolveOptions& options, int32_t k) {
  detail::SearchConfig c;
  c.seed = options.seed + uint64_t(k) * 0x9E3779B97F4A7C15ull;
  c.verbose = options.verbose;
  c.id = k;
  // Odd runs pass messages in reverse node order (trws.h), so a portfolio of two decodes
  // plans of both orders; neither order is better everywhere. With 2 threads and the same
  // work, reversing run 1 took C-perturb-s7 from 81.87e9 to 79.92e9 (2.4 %), public A from
  // 6.569e9 to 6.550e9, A-mem1.1 and S-memmid 0.4 % and 0.2 % lower, L and S the same;
  // reversing run 0 instead lost public S 1.1 %, and reversing both lost public C 3 %.
  c.reverse_sweeps = k % 2 == 1;
  switch (k % 4) {
    case 1:
      c.polish_share_dual = 0.35;
      c.polish_share_primal = 0.7;
      c.first_step_scale = 0.6;
      c.first_target_gap = 0.3;
      c.push_after_over_rounds = 10;
      break;
    case 2:
      c.polish_share_dual = 0.1;
      c.polish_share_primal = 0.35;
      c.lns_tree_size = 64;
      break;
    case 3:
      c.polish_share_dual = 0.2;
      c.polish_share_primal = 0.8;
      c.lns_tree_size = 32;
      break;
    default:
      break;
  }
  return c;
}

// Seconds of HiGHS presolve plus root LP per MILP column, roughly, on one slow core: 4e-5 on
// G-mem0.97 (78 k columns), 1e-4 on S-sub2000 (123 k, under load). Presolve cannot be
// interrupted, so this gates which problems the MILP may start on.
constexpr double kMilpSecondsPerColumn = 5e-5;
// ... and by its nonzeros: HiGHS computes an analytic centre (an interior point solve that
// neither the time limit nor the interrupt reaches) beside its root LP and waits for it, again
// after each restart. Its cost grows faster than the nonzeros (the long memory rows fill the
// normal equations): S-sub2000, 1.09 M nonzeros with its memory rows, overran a 20 s limit by
// 6 s, C-sub2000 (0.61 M) an 8 s limit by 5 s, while A-sub2000 and L-sub2000 (0.14 M) were
// proven optimal in 1.2 and 1.8 s. Seconds per (million nonzeros)^2, fitted on S-sub2000.
constexpr double kMilpSecondsPerSquaredMegaNonzeros = 20.0;
// A MILP whose memory rows are added lazily starts with its LP relaxation without them, which
// HiGHS can interrupt, and starts a MILP round only when the time for one is left (milp.h):
// its first LP took 2.0e-5 s per column on C-perturb (93 k columns), 1.6e-5 on public A.
constexpr double kLazyLpSecondsPerColumn = 2.5e-5;
// With one thread, the search's share of the time before the MILP takes over.
constexpr double kSearchShareBeforeMilp = 0.3;

// A MILP that stops early leaves its thread to a search when at least this much time is left.
constexpr double kMinSearchAfterMilpS = 1.0;

// The problem the MILP solves: the reduced one or the original, whichever has the smaller
// model over its clusters. The reductions usually shrink it, but on the XLA graphs they split
// clusters: C-perturb's 451 become 6,924 after reduction (public C without the eliminations:
// 10,892, with 10,655 nodes left a single strategy), past the model's cap of 6,000, while the
// original's model has 93 k columns.
struct MilpTarget {
  const detail::GraphView* g = nullptr;
  const detail::Clusters* clusters = nullptr;
  int64_t usage_limit = -1;
  bool original = false;  // plans and bounds are the original problem's, else the reduced one's
  detail::MilpSize size;  // of its model
};

// The original problem's view is built for the MILP only up to this many edge-matrix entries
// (public A, C: 5.5 M; P: 0.9 M): the 3-D planner problems have 71 M, 1.5 GB of JSON, and a
// view of them would cost seconds and a copy of what is not referenced.
constexpr int64_t kMaxOriginalEntriesForMilp = 16'000'000;

int64_t edge_entries(const Problem& p) {
  int64_t n = 0;
  for (const Edge& e : p.edges) n += static_cast<int64_t>(e.costs.size());
  return n;
}

// Whether the MILP gets a turn: its model small enough that HiGHS's presolve and root LP (or,
// with lazy memory rows, its first LP) likely take at most 30 % of the time, no work limit
// (HiGHS's clock would make the run depend on the machine), and no budget branch and bound to
// follow (the dispatcher then sets stall_rounds; that branching closes the planner's budget
// gaps in well under a second).
bool milp_gets_a_turn(const MilpTarget& t, const SolveOptions& o) {
  if (o.work_limit > 0 || o.stall_rounds > 0 || t.size.columns < 0) return false;
  const double per_column = t.size.lazy_memory ? kLazyLpSecondsPerColumn : kMilpSecondsPerColumn;
  const double mega_nonzeros = static_cast<double>(t.size.nonzeros) / 1e6;
  const double seconds = std::max(per_column * static_cast<double>(t.size.columns),
                                  kMilpSecondsPerSquaredMegaNonzeros * mega_nonzeros * mega_nonzeros);
  return seconds < 0.3 * o.time_limit_s;
}

// What the MILP found, in the original problem's terms.
struct MilpOutcome {
  Solution plan;  // empty when none
  Cost cost = 0;
  Cost lower_bound = -kInfeasibleCost;
  const char* stopped_by = "time limit";  // or "proven optimal", "gap tolerance", "another run's proof"
  double time_to_first_s = -1;
};

// The MILP until `deadline` from `start` (an original plan, or none). Its plan is kept only if
// the original problem's own evaluation accepts it; a proof (or the gap tolerance) sets
// `proven` for the searches.
MilpOutcome run_milp(const MilpTarget& t, const Problem& problem, const Reduction& red, bool integer_costs,
                     const SolveOptions& options, Clock::time_point deadline, const Solution* start,
                     std::atomic<bool>* proven, Clock::time_point t0) {
  MilpOutcome out;
  SolveOptions mo = options;
  mo.time_limit_s = to_seconds(deadline - Clock::now());
  if (mo.time_limit_s <= 0.05) return out;
  // The MILP's start, in the terms of the problem it solves.
  Solution own_start;
  if (start != nullptr && !start->empty()) {
    if (t.original) {
      own_start = *start;
    } else {
      own_start.assign(red.reduced.num_nodes(), -1);
      for (size_t r = 0; r < own_start.size(); ++r) {
        const auto& orig = red.original_strategy[r];
        const auto it = std::find(orig.begin(), orig.end(), (*start)[red.original_node[r]]);
        if (it == orig.end()) {
          own_start.clear();
          break;
        }
        own_start[r] = static_cast<int32_t>(it - orig.begin());
      }
    }
  }
  const SolveResult m = detail::solve_milp(*t.g, *t.clusters, t.usage_limit, integer_costs, mo,
                                           own_start.empty() ? nullptr : &own_start, proven);
  const Cost offset = t.original ? 0.0 : red.cost_offset;
  out.lower_bound = m.lower_bound + offset;
  if (m.found) {
    Solution plan = t.original ? m.solution : red.expand(m.solution);
    const Evaluation ev = evaluate(problem, plan);
    if (ev.valid) {
      out.plan = std::move(plan);
      out.cost = ev.cost;
      out.time_to_first_s = seconds_since(t0);
      if (bound_proves_optimal(ev.cost, out.lower_bound, integer_costs)) {
        out.stopped_by = "proven optimal";
      } else if (options.gap_tolerance > 0 && ev.cost - out.lower_bound <= options.gap_tolerance * std::abs(ev.cost)) {
        out.stopped_by = "gap tolerance";
      }
    }
  }
  if (std::string(out.stopped_by) != "time limit")
    proven->store(true);
  else if (proven->load())
    out.stopped_by = "another run's proof";
  if (options.verbose)
    std::fprintf(stderr, "[milp] %s (on the %s problem) after %.2fs: cost %.17g, bound %.17g\n", m.status.c_str(),
                 t.original ? "original" : "reduced", seconds_since(t0), out.plan.empty() ? NAN : out.cost,
                 out.lower_bound);
  return out;
}

}  // namespace

SolveResult solve_heuristic(const Problem& problem, const SolveOptions& options) {
  const auto t0 = Clock::now();
  detail::SearchStop stop;
  // Capped so that a huge limit cannot overflow the clock's tick count (1e10 s did).
  stop.deadline = t0 + from_seconds(std::clamp(options.time_limit_s, 0.0, kMaxTimeLimitS));
  stop.work_limit = options.work_limit;
  std::atomic<bool> proven{false};
  stop.proven = &proven;
  SolveResult result;
  result.lower_bound = -std::numeric_limits<Cost>::infinity();

  const Reduction red = reduce(problem);
  if (options.verbose)
    std::fprintf(stderr,
                 "[heuristic] reduce: %zu -> %zu nodes, %lld -> %lld strategies "
                 "(infeasible %lld, memory %lld, budget %lld, dominated %lld, eliminated %lld) in %.2fs\n",
                 problem.num_nodes(), red.reduced.num_nodes(), (long long)red.stats.strategies_before,
                 (long long)red.stats.strategies_after, (long long)red.stats.infeasible_removed,
                 (long long)red.stats.memory_removed, (long long)red.stats.budget_removed,
                 (long long)red.stats.dominated_removed, (long long)red.stats.nodes_eliminated, red.stats.seconds);
  if (red.infeasible) {
    result.status = "infeasible: " + red.infeasible_reason;
    result.lower_bound = std::numeric_limits<Cost>::infinity();
    result.total_time_s = seconds_since(t0);
    return result;
  }
  // The reductions solved the whole problem: the plan they recorded is optimal (its cost is
  // the dropped constant) and there is nothing left to search. The search would stop at once
  // on the empty problem without a plan, leaving no plan and no bound.
  if (red.reduced.num_nodes() == 0) {
    const Solution x = red.expand({});
    const Evaluation ev = evaluate(problem, x);
    if (ev.valid) {
      result.found = true;
      result.solution = x;
      result.cost = ev.cost;
      result.lower_bound = ev.cost;
      result.peak_usage = ev.peak_usage;
      result.proven_optimal = true;
      result.status = "optimal";
      result.time_to_first_s = seconds_since(t0);
    } else {  // would be a reduction bug; claim nothing
      result.status = "no valid plan found (the reduced plan breaks: " + ev.violation + ")";
    }
    result.total_time_s = seconds_since(t0);
    return result;
  }

  const auto t_views = Clock::now();
  // The view references the reduced problem's matrices (lone u < v edges, already clamped by
  // the reductions) instead of copying them: `red` outlives it.
  const detail::GraphView g = detail::build_referencing_view(red.reduced);
  const detail::Clusters clusters = detail::find_clusters(g);
  if (options.verbose)
    std::fprintf(stderr, "[heuristic] graph view and clusters in %.2fs (%.2fs since the start)\n",
                 seconds_since(t_views), seconds_since(t0));
  const int32_t runs = std::max(1, options.threads);
  const bool integer_costs = has_integer_costs(red.reduced) && std::nearbyint(red.cost_offset) == red.cost_offset;

  // The MILP's problem (MilpTarget): the original's view is built only when the MILP may run.
  MilpTarget milp_target{&g, &clusters, red.reduced.usage_limit, false, {}};
  detail::GraphView original_view;
  detail::Clusters original_clusters;
  if (options.work_limit <= 0 && options.stall_rounds <= 0) {
    milp_target.size = detail::milp_size(g, clusters, red.reduced.usage_limit);
  }
  if (options.work_limit <= 0 && options.stall_rounds <= 0 && edge_entries(problem) <= kMaxOriginalEntriesForMilp) {
    original_view = detail::build_referencing_view(problem);
    original_clusters = detail::find_clusters(original_view);
    const detail::MilpSize original = detail::milp_size(original_view, original_clusters, problem.usage_limit);
    if (original.columns >= 0 && (milp_target.size.columns < 0 || original.columns < milp_target.size.columns))
      milp_target = {&original_view, &original_clusters, problem.usage_limit, true, original};
  }
  const bool milp = milp_gets_a_turn(milp_target, options);
  const bool milp_integer_costs = milp_target.original ? has_integer_costs(problem) : integer_costs;
  if (options.verbose)
    std::fprintf(stderr,
                 "[heuristic] MILP over the %s problem's %d clusters: %lld columns, %lld nonzeros%s, %s (%.2fs since "
                 "the start)\n",
                 milp_target.original ? "original" : "reduced", milp_target.clusters->num_clusters(),
                 (long long)milp_target.size.columns, (long long)milp_target.size.nonzeros,
                 milp_target.size.lazy_memory ? " (lazy memory rows)" : "", milp ? "gets a turn" : "not tried",
                 seconds_since(t0));
  // With the MILP, one more search may follow it: on a thread of its own beside the searches
  // (the last run's place), or after it with one thread. It runs only if the MILP stops early,
  // unproven (outcomes of runs that did not run bound nothing).
  std::vector<detail::SearchOutcome> outcomes(milp && runs == 1 ? 2 : runs);
  if (milp) outcomes.back().lower_bound = -std::numeric_limits<Cost>::infinity();
  MilpOutcome milp_out;
  auto run = [&](int32_t k, const detail::SearchStop& until) {
    detail::SearchConfig config = portfolio_config(options, k);
    config.integer_costs = integer_costs;
    config.gap_tolerance = options.gap_tolerance;
    config.stall_rounds = options.stall_rounds;
    outcomes[k] = detail::lagrangian_search(g, clusters, red.reduced.usage_limit, config, until, red.cost_offset);
  };
  auto milp_from = [&](const Solution* start) {
    milp_out = run_milp(milp_target, problem, red, milp_integer_costs, options, stop.deadline, start, &proven, t0);
  };
  // A MILP that stopped early (no time for its next round, or no plan) hands its thread back
  // to a search: one more run of the portfolio, from scratch.
  auto search_after_milp = [&] {
    if (!proven.load() && to_seconds(stop.deadline - Clock::now()) > kMinSearchAfterMilpS)
      run(static_cast<int32_t>(outcomes.size()) - 1, stop);
  };
  if (runs == 1 && milp) {
    detail::SearchStop first = stop;
    first.deadline = t0 + std::chrono::duration_cast<Clock::duration>((stop.deadline - t0) * kSearchShareBeforeMilp);
    run(0, first);
    const Solution start = outcomes[0].best.empty() ? Solution{} : red.expand(outcomes[0].best);
    if (!proven.load()) {
      milp_from(&start);
      search_after_milp();
    }
  } else if (runs == 1) {
    run(0, stop);
  } else {
    std::vector<std::thread> workers;
    const int32_t searches = milp ? runs - 1 : runs;
    for (int32_t k = 0; k < searches; ++k) workers.emplace_back(run, k, std::cref(stop));
    if (milp)
      workers.emplace_back([&] {
        milp_from(nullptr);
        search_after_milp();
      });
    for (auto& w : workers) w.join();
  }

  // A proof wins (the first run that proved, the MILP after the searches); otherwise the
  // cheapest plan, ties to the lowest run index and then the searches, so the pick is
  // deterministic. Compared in the original problem's terms.
  int32_t winner = -1;
  bool by_proof = false;
  for (int32_t k = 0; k < static_cast<int32_t>(outcomes.size()); ++k) {
    const auto& o = outcomes[k];
    result.lower_bound = std::max(result.lower_bound, o.lower_bound + red.cost_offset);
    if (o.best.empty() || by_proof) continue;
    by_proof = std::string(o.stopped_by) == "proven optimal";
    if (by_proof || winner < 0 || o.best_cost < outcomes[winner].best_cost) winner = k;
    if (o.time_to_first_s >= 0 && (result.time_to_first_s < 0 || o.time_to_first_s < result.time_to_first_s))
      result.time_to_first_s = o.time_to_first_s;
  }
  result.work = 0;
  for (const auto& o : outcomes) result.work += o.work;
  const char* stopped_by = "time limit";
  if (winner >= 0) {
    const auto& o = outcomes[winner];
    result.found = true;
    result.solution = red.expand(o.best);
    result.cost = o.best_cost + red.cost_offset;
    stopped_by = o.stopped_by;
  }
  if (milp) {
    result.lower_bound = std::max(result.lower_bound, milp_out.lower_bound);
    const bool milp_proof = std::string(milp_out.stopped_by) == "proven optimal";
    if (!milp_out.plan.empty() && !by_proof && (!result.found || milp_proof || milp_out.cost < result.cost)) {
      result.found = true;
      result.solution = std::move(milp_out.plan);
      result.cost = milp_out.cost;
      stopped_by = milp_out.stopped_by;
    }
    if (milp_out.time_to_first_s >= 0 &&
        (result.time_to_first_s < 0 || milp_out.time_to_first_s < result.time_to_first_s))
      result.time_to_first_s = milp_out.time_to_first_s;
  }
  if (result.found) {
    result.peak_usage = evaluate(problem, result.solution).peak_usage;
    result.proven_optimal = bound_proves_optimal(result.cost, result.lower_bound, integer_costs);
    result.status = result.proven_optimal ? "optimal" : stopped_by;
  } else {
    result.status = "no valid plan found within the time limit";
  }
  result.total_time_s = seconds_since(t0);
  return result;
}

}  // namespace autoshard
