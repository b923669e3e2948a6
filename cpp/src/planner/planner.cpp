// The planning flow: graph -> strategies -> solver problem -> solve -> plan.
#include "autoshard/planner.h"

#include "autoshard/clock.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "autoshard/evaluate.h"
#include "autoshard/infeasibility.h"
#include "autoshard/solver.h"

namespace autoshard {

namespace {

// No plan: thrown inside plan_within_limits and turned into InfeasiblePlanError by
// run_planner once the failed attempt's tables are freed, with the diagnosis of which
// constraints conflict (infeasibility.h) appended to `headline`.
struct NoPlan {
  std::string headline;
  bool proven = true;  // false: the time ran out before a plan or a proof
  // The one constraint the headline already names (its diagnosis adds nothing when the
  // conflict is that constraint alone).
  std::optional<UserConstraint::Kind> named;
};

}  // namespace

namespace {

std::string mesh_str(const Mesh& m) {
  std::string s;
  for (size_t i = 0; i < m.shape.size(); ++i) s += (i ? "x" : "") + std::to_string(m.shape[i]);
  return s;
}

// Refuses before lowering when the cost tables (and the solver's copies of them) would not
// fit under the cap: they are the bulk of the memory, growing as strategies^2.
void check_problem_size(const ShardingModel& sm, const BuildLimits& limits) {
  const TableEstimate t = estimate_cost_tables(sm);
  const double bytes =
      t.entries * static_cast<double>(kBytesPerTableEntry) + static_cast<double>(limits.strategy_bytes);
  if (bytes <= static_cast<double>(limits.max_bytes)) return;
  size_t strategies = 0;  // enumerated (tied copies share their representative's)
  for (const auto& s : sm.strategies) strategies += s.size();
  const std::string entries = fmt::format("{:.3g}", t.entries);
  throw PlanningLimitError(
      "the solver problem for this graph on mesh " + mesh_str(sm.model->mesh) + " is estimated to need " +
      human_bytes(bytes) + " (" + std::to_string(strategies) + " strategies over " +
      std::to_string(sm.strategies.size()) + " nodes, " + entries + " cost-table entries; the largest table is " +
      t.largest_what + "), above the memory cap of " + human_bytes(static_cast<double>(limits.max_bytes)) + " (" +
      limits.cap_source +
      "); use a mesh with fewer dimensions (strategies per node grow exponentially with "
      "them), pin layouts with constraints, or raise the cap with --max-problem-bytes / max_problem_bytes if the "
      "machine has the memory");
}

// Nodes a constraint pins by name: their layers stay untied (their strategies differ).
std::vector<bool> pinned_by_name(const Graph& g, const PlacementConstraints& c) {
  std::vector<bool> pinned(g.nodes.size(), false);
  auto mark = [&](const std::string& name) {
    auto it = g.index_by_name.find(name);
    if (it != g.index_by_name.end()) pinned[it->second] = true;  // unknown names fail later, with a message
  };
  for (const auto& [name, layout] : c.inputs) mark(name);
  for (const auto& [name, layout] : c.nodes) mark(name);
  return pinned;
}

std::string tie_note(const RepeatedLayers& t) {
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
  };
  std::string note = std::to_string(t.tied.size()) + " identical layers of '" + t.container + "' (" +
                     std::to_string(t.nodes_per_layer) +
                     " nodes each) were planned tied: every one takes the "
                     "strategies of " +
                     t.container + "." + std::to_string(t.tied[0]) +
                     " (repeated_layers=\"untie\" / --repeated-layers untie plans each on its own)";
  if (!t.untied.empty()) note += "; layers " + list(t.untied) + " differ and were planned on their own";
  return note;
}

// A plan this many times its lower bound when the solver's time ran out is the safety net's
// (the greedy's), not a search's: seen when building the problem took most of the time limit
// on a loaded machine (Llama-3-70B's Megatron-pinned problem, 19k nodes: 256x its bound with
// 1.3 s left for the solver, the optimum with 8 s). Real gaps at a limit are far smaller
// (dense 3-D mesh problems: under 30 %).
constexpr double kFarAboveBound = 2.0;

// The solver with `so`'s time; when that ends at a plan far above its bound, once more with
// the whole time limit (`limit_s`), keeping the better plan and bound. Planning then takes
// longer than the limit, which `notes` says: a plan hundreds of times slower than it need
// be is worse for a user than a late one.
SolveResult solve_with_second_chance(const Problem& p, const SolveOptions& so, double limit_s,
                                     std::vector<std::string>& notes) {
  SolveResult first = solve(p, so);
  const bool far = first.found && !first.proven_optimal && first.lower_bound > 0 &&
                   first.cost > kFarAboveBound * first.lower_bound;
  if (!far) return first;
  SolveOptions again = so;
  again.time_limit_s = limit_s;
  SolveResult second = solve(p, again);
  const double ratio = first.cost / first.lower_bound;
  SolveResult& kept = second.found && second.cost < first.cost ? second : first;
  kept.lower_bound = std::max(first.lower_bound, second.lower_bound);
  kept.total_time_s = first.total_time_s + second.total_time_s;
  notes.push_back(fmt::format(
      "the solver's time ran out at a plan {:.1f}x its lower bound (building the problem took most of the time "
      "limit), so it was given the whole limit ({:g} s, time_limit_s) once more: the plan is now {:.2f}x its bound",
      ratio, limit_s, kept.cost / std::max(kept.lower_bound, 1e-12)));
  return kept;
}

// `solver_memory_limit`: whether the solver holds options.memory_limit_bytes itself (false:
// it plans the fastest layouts and recomputation alone fits them to the limit).
PlanningResult plan_within_limits(const Graph& graph, const PlannerOptions& options, BuildLimits& limits,
                                  bool solver_memory_limit = true) {
  auto t0 = Clock::now();
  PlanningResult r;
  r.model = std::make_unique<MeshModel>(MeshModel::make(options.mesh, options.hardware));
  RepeatedLayers tied;
  if (options.repeated_layers != LayerTying::Untie)
    tied = find_repeated_layers(graph, pinned_by_name(graph, options.constraints));
  r.sharding = build_sharding_model(graph, *r.model, enumerate_strategies(graph, *r.model, &limits, &tied),
                                    options.constraints, tied);
  // Auto keeps the ties only where planning every layer on its own would be large.
  if (options.repeated_layers == LayerTying::Auto && tied.any() &&
      estimate_cost_tables(r.sharding).untied_entries <= kAutoTieEntries)
    untie_layers(r.sharding);
  if (r.sharding.tied.any()) r.plan.notes.push_back(tie_note(r.sharding.tied));
  r.plan.enumerate_time_s = seconds_since(t0);
  check_problem_size(r.sharding, limits);
  LoweringOptions lo;
  lo.limits = &limits;
  lo.parameter_memory = effective_parameter_memory(options);
  lo.memory_limit_bytes = solver_memory_limit ? options.memory_limit_bytes : -1;
  RedistributionCache cache(*r.model);
  r.lowered = lower_to_problem(r.sharding, lo, cache);
  r.plan.lower_time_s = seconds_since(t0) - r.plan.enumerate_time_s;
  if (auto why = obvious_infeasibility(r.sharding, r.lowered)) throw NoPlan{why->message, true, why->names};
  if (!r.lowered.budget_raised_for.empty()) {
    const auto& raised = r.lowered.budget_raised_for;
    const std::string high = fmt::format("{:.4g}", lo.parameter_memory->second);
    std::string list;
    for (size_t i = 0; i < raised.size() && i < 5; ++i) list += (i ? ", " : "") + raised[i];
    if (raised.size() > 5) list += ", and " + std::to_string(raised.size() - 5) + " more";
    r.plan.notes.push_back("the parameter memory budget (high = " + high +
                           " of each parameter) cannot be "
                           "met by " +
                           std::to_string(raised.size()) +
                           " parameter(s), so their share was raised to "
                           "the least any strategy reaches: " +
                           list);
  }

  const Problem& p = r.lowered.problem;
  Plan& plan = r.plan;
  plan.solver_nodes = p.num_nodes();
  plan.solver_edges = p.edges.size();
  Solution solution;
  Cost objective = 0, bound = 0;
  if (p.num_nodes() > 0) {
    SolveOptions so;
    // The time limit covers building too; the solver gets the rest, but always a little time
    // to produce a plan (building stops at the limit itself).
    so.time_limit_s = std::max(0.05 * options.time_limit_s, options.time_limit_s - seconds_since(t0));
    so.gap_tolerance = options.gap_tolerance;
    so.verbose = options.verbose;
    if (options.verbose)
      std::fprintf(stderr, "[planner] problem built in %.2fs; the solver gets %.2fs\n", seconds_since(t0),
                   so.time_limit_s);
    SolveResult sr = solve_with_second_chance(p, so, options.time_limit_s, plan.notes);
    plan.solver_status = sr.status;
    plan.proven_optimal = sr.proven_optimal;
    plan.solve_time_s = sr.total_time_s;
    Evaluation ev = sr.solution.size() == p.num_nodes() ? evaluate(p, sr.solution) : Evaluation{};
    if (!ev.valid) {
      if (sr.found)
        throw std::logic_error("internal error: the solver's plan failed the independent check (" + ev.violation +
                               "); please report this with the graph");
      const std::string limit = fmt::format("{:g}", options.time_limit_s);
      if (!sr.proven_infeasible)
        throw NoPlan{
            "no plan found within the time limit (" + limit +
                " s, --time-limit / "
                "time_limit_s): the solver stopped before finding any plan that meets the constraints, and did "
                "not prove that none exists; raise the time limit",
            false, std::nullopt};
      throw NoPlan{"no feasible plan exists (proven by the solver: " + sr.status + ").", true, std::nullopt};
    }
    solution = sr.solution;
    objective = ev.cost;
    bound = std::min(sr.lower_bound, ev.cost);
  } else {
    plan.solver_status = "trivial";
    plan.proven_optimal = true;
  }
  plan.choice = expand_solution(r.lowered, solution);
  plan.cost = evaluate_choice(r.sharding, plan.choice, cache, r.lowered.overlap);
  const int64_t limit =
      options.memory_limit_bytes > 0 ? options.memory_limit_bytes : default_memory_limit(options.hardware);
  plan.recompute = choose_recompute(r.sharding, plan.choice, options.optimizer, options.recompute, limit, cache,
                                    r.lowered.overlap);
  plan.memory = plan.recompute.memory;
  plan.solver_objective_us = objective + r.lowered.constant_cost;
  // The lowering must price every plan exactly as the graph does; a mismatch is a bug here,
  // never something to report as a plan.
  if (std::abs(plan.solver_objective_us - plan.cost.total_us) > 1e-6 * std::max(1.0, plan.cost.total_us))
    throw std::logic_error("internal error: the solver problem prices the plan at " +
                           std::to_string(plan.solver_objective_us) + " us but the graph at " +
                           std::to_string(plan.cost.total_us) + " us; please report this with the graph");
  plan.lower_bound_us = (plan.proven_optimal ? objective : bound) + r.lowered.constant_cost;
  plan.total_time_s = seconds_since(t0);
  return r;
}

std::string step_ms(const Plan& p) {
  return fmt::format("{:.3f} ms", (p.cost.total_us + p.recompute.added_us) / 1000.0);
}

// A memory limit is met two ways: by the layouts (the solver holds the limit: more sharding,
// more communication) or by recomputation on the fastest layouts. Both are planned (the
// second only when the fastest layouts do not fit as they are) and the faster one that fits
// is kept; the report says what the other would cost.
PlanningResult plan_to_fit(const Graph& graph, const PlannerOptions& options, BuildLimits& limits) {
  const auto t0 = Clock::now();
  PlanningResult fastest = plan_within_limits(graph, options, limits, false);
  if (fastest.plan.recompute.fits && fastest.plan.recompute.added_us == 0) return fastest;
  PlannerOptions rest = options;
  rest.time_limit_s = std::max(0.5 * options.time_limit_s, options.time_limit_s - seconds_since(t0));
  BuildLimits again = limits;
  again.time_limit_s = rest.time_limit_s;
  again.deadline = Clock::now() + from_seconds(rest.time_limit_s);
  std::optional<PlanningResult> sharded;
  std::exception_ptr no_layouts;  // why the solver found no layouts within the limit
  try {
    sharded = plan_within_limits(graph, rest, again, true);
  } catch (const NoPlan&) {
    no_layouts = std::current_exception();
  } catch (const InfeasibleLayoutsError&) {
    no_layouts = std::current_exception();
  }
  // Nothing fits: the solver's own verdict (and its diagnosis of which constraints conflict).
  if (!sharded && !fastest.plan.recompute.fits) std::rethrow_exception(no_layouts);
  auto step_us = [](const Plan& p) { return p.cost.total_us + p.recompute.added_us; };
  const bool sharded_wins = sharded && sharded->plan.recompute.fits &&
                            (!fastest.plan.recompute.fits || step_us(sharded->plan) < step_us(fastest.plan));
  const std::string other =
      sharded_wins ? "the fastest layouts with recomputation: " + step_ms(fastest.plan) +
                         (fastest.plan.recompute.fits ? "" : ", not fitting")
      : sharded ? "layouts planned to the limit by the solver: " + step_ms(sharded->plan) +
                      (sharded->plan.recompute.fits ? "" : ", not fitting")
                : std::string("layouts planned to the limit by the solver: no plan");
  PlanningResult kept = sharded_wins ? std::move(*sharded) : std::move(fastest);
  kept.plan.notes.push_back("memory limit met by " +
                            std::string(sharded_wins ? "the layouts the solver planned to it"
                                                     : "recomputation on the fastest layouts") +
                            ", " + step_ms(kept.plan) + " a step (against " + other + ")");
  kept.plan.total_time_s = seconds_since(t0);
  return kept;
}

}  // namespace

PlanningResult run_planner(const Graph& graph, const PlannerOptions& given) {
  validate_planner_options(given);
  PlannerOptions options = given;
  options.time_limit_s = checked_time_limit(given.time_limit_s, "time_limit_s");
  BuildLimits limits;
  limits.time_limit_s = options.time_limit_s;
  limits.deadline = Clock::now() + from_seconds(options.time_limit_s);
  if (options.max_problem_bytes > 0) {
    limits.max_bytes = options.max_problem_bytes;
    limits.cap_source = "set by --max-problem-bytes / max_problem_bytes";
  } else {
    limits.max_bytes = default_problem_memory_cap(&limits.cap_source);
  }
  std::optional<NoPlan> failed;
  try {
    if (options.memory_limit_bytes > 0 && options.recompute == RecomputeMode::Auto)
      return plan_to_fit(graph, options, limits);
    return plan_within_limits(graph, options, limits);
  } catch (NoPlan& e) {
    failed = std::move(e);
  } catch (const InfeasibleLayoutsError& e) {
    failed = NoPlan{e.what(), true, std::nullopt};
  } catch (const std::bad_alloc&) {
    // The estimate is not exact; running out anyway still gets a message, not a bare bad_alloc.
    throw PlanningLimitError("ran out of memory while planning on mesh " + mesh_str(options.mesh) + " (memory cap " +
                             human_bytes(static_cast<double>(limits.max_bytes)) + ", " + limits.cap_source +
                             "); lower the cap with --max-problem-bytes / max_problem_bytes so "
                             "that such a problem is refused early, or use a mesh with fewer dimensions");
  }
  // No plan: find which constraints conflict, in half the time limit again at most (but at
  // least a second), and say so after the headline.
  DiagnosisOptions dopt;
  dopt.budget_s = std::max(1.0, 0.5 * options.time_limit_s);
  dopt.max_problem_bytes = limits.max_bytes;
  std::string diagnosis;
  try {
    InfeasibilityDiagnosis d = diagnose_infeasibility(graph, options, failed->proven, dopt);
    const bool only_named = failed->named && d.conflict.size() == 1 && d.member_necessary[0] &&
                            d.constraints[d.conflict[0]].kind == *failed->named;
    if (!only_named) diagnosis = format_diagnosis(graph, options, d);
  } catch (const std::bad_alloc&) {
    diagnosis = "\n(The diagnosis of which constraints conflict ran out of memory.)";
  }
  throw InfeasiblePlanError(failed->headline + diagnosis);
}

}  // namespace autoshard
