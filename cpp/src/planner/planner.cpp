// The planning flow: graph -> strategies -> solver problem -> solve -> plan JSON + report.
#include "autoshard/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "autoshard/evaluate.h"
#include "autoshard/report.h"
#include "autoshard/solver.h"

namespace autoshard {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string constraint_hint(const ShardingModel& sm, int32_t g) {
  return sm.pinned[g] ? " (it is pinned by a constraint)" : "";
}

// Cheap necessary conditions, checked before solving so that an impossible request gets a
// message naming the constraint to relax instead of a bare "infeasible".
void check_obviously_infeasible(const ShardingModel& sm, const LoweredProblem& lp) {
  const Problem& p = lp.problem;
  const Graph& g = *sm.graph;
  for (size_t s = 0; s < p.num_nodes(); ++s) {
    bool any = std::any_of(p.node_costs[s].begin(), p.node_costs[s].end(), [](Cost c) { return !is_infeasible(c); });
    if (!any) {
      int32_t gi = lp.graph_node[s];
      throw InfeasiblePlanError("no feasible plan: node '" + g.nodes[gi].name + "' (" + g.nodes[gi].op + ")" +
                                constraint_hint(sm, gi) +
                                " has no strategy compatible with the fixed layouts around it; relax the "
                                "input/output/node constraints on it or its neighbours");
    }
  }
  if (lp.budget_index >= 0) {
    const GlobalBudget& b = p.budgets[lp.budget_index];
    int64_t most = 0;
    for (const auto& row : b.usage)
      if (!row.empty()) most += *std::max_element(row.begin(), row.end());
    if (most < b.low)
      throw InfeasiblePlanError("no feasible plan: parameter_memory low asks for at least " + std::to_string(b.low) +
                                " parameter bytes per GPU but fully replicated parameters only take " +
                                std::to_string(most) + "; lower parameter_memory.low");
  }
  if (p.usage_limit >= 0) {
    // Smallest possible live usage at each time point.
    std::map<int64_t, int64_t> delta;
    for (size_t s = 0; s < p.num_nodes(); ++s) {
      if (p.node_usages[s].empty()) continue;
      int64_t m = *std::min_element(p.node_usages[s].begin(), p.node_usages[s].end());
      if (p.intervals[s].end <= p.intervals[s].start || m == 0) continue;
      delta[p.intervals[s].start] += m;
      delta[p.intervals[s].end] -= m;
    }
    int64_t live = 0, peak = 0, at = 0;
    for (const auto& [t, d] : delta) {
      live += d;
      if (live > peak) { peak = live; at = t; }
    }
    if (peak > p.usage_limit) {
      std::string where = at < static_cast<int64_t>(g.nodes.size()) ? " (at node '" + g.nodes[at].name + "')" : "";
      throw InfeasiblePlanError("no feasible plan: memory_limit_bytes=" + std::to_string(p.usage_limit) +
                                " is below the smallest possible peak of " + std::to_string(peak) +
                                " bytes per GPU" + where + " even with every tensor maximally sharded; raise "
                                "memory_limit_bytes or use a larger mesh");
    }
  }
}

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
  const double bytes = t.entries * static_cast<double>(kBytesPerTableEntry) + static_cast<double>(limits.strategy_bytes);
  if (bytes <= static_cast<double>(limits.max_bytes)) return;
  size_t strategies = 0;
  for (const auto& s : sm.strategies) strategies += s.size();
  char entries[32];
  std::snprintf(entries, sizeof entries, "%.3g", t.entries);
  throw PlanningLimitError(
      "the solver problem for this graph on mesh " + mesh_str(sm.model->mesh) + " is estimated to need " +
      human_bytes(bytes) + " (" + std::to_string(strategies) + " strategies over " +
      std::to_string(sm.strategies.size()) + " nodes, " + entries + " cost-table entries; the largest table is " +
      t.largest_what + "), above the memory cap of " + human_bytes(static_cast<double>(limits.max_bytes)) + " (" +
      limits.cap_source + "); use a mesh with fewer dimensions (strategies per node grow exponentially with "
      "them), pin layouts with constraints, or raise the cap with --max-problem-bytes / max_problem_bytes if the "
      "machine has the memory");
}

PlanningResult plan_within_limits(const Graph& graph, const PlannerOptions& options, BuildLimits& limits) {
  auto t0 = Clock::now();
  PlanningResult r;
  r.model = std::make_unique<MeshModel>(MeshModel::make(options.mesh, options.hardware));
  r.sharding = build_sharding_model(graph, *r.model, enumerate_strategies(graph, *r.model, &limits),
                                    options.constraints);
  r.plan.enumerate_time_s = seconds_since(t0);
  check_problem_size(r.sharding, limits);
  LoweringOptions lo;
  lo.limits = &limits;
  if (options.parameter_memory_default)
    lo.parameter_memory = std::make_pair(0.0, 1.0 / static_cast<double>(r.model->mesh.size()));
  else
    lo.parameter_memory = options.parameter_memory;
  lo.memory_limit_bytes = options.memory_limit_bytes;
  RedistributionCache cache(*r.model);
  r.lowered = lower_to_problem(r.sharding, lo, cache);
  r.plan.lower_time_s = seconds_since(t0) - r.plan.enumerate_time_s;
  check_obviously_infeasible(r.sharding, r.lowered);
  if (!r.lowered.budget_raised_for.empty()) {
    const auto& raised = r.lowered.budget_raised_for;
    char high[32];
    std::snprintf(high, sizeof high, "%.4g", lo.parameter_memory->second);
    std::string list;
    for (size_t i = 0; i < raised.size() && i < 5; ++i) list += (i ? ", " : "") + raised[i];
    if (raised.size() > 5) list += ", and " + std::to_string(raised.size() - 5) + " more";
    r.plan.notes.push_back("the parameter memory budget (high = " + std::string(high) + " of each parameter) cannot be "
                           "met by " + std::to_string(raised.size()) + " parameter(s), so their share was raised to "
                           "the least any strategy reaches: " + list);
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
    so.verbose = options.verbose;
    SolveResult sr = solve(p, so);
    plan.solver_status = sr.status;
    plan.proven_optimal = sr.proven_optimal;
    plan.solve_time_s = sr.total_time_s;
    Evaluation ev = sr.solution.size() == p.num_nodes() ? evaluate(p, sr.solution) : Evaluation{};
    if (!ev.valid) {
      if (sr.found)
        throw std::logic_error("internal error: the solver's plan failed the independent check (" + ev.violation +
                               "); please report this with the graph");
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", options.time_limit_s);
      if (!sr.proven_infeasible)
        throw InfeasiblePlanError(
            "no plan found within the time limit (" + std::string(limit) + " s, --time-limit / time_limit_s): the "
            "solver stopped before finding any plan that meets the constraints, and did not prove that none "
            "exists; raise the time limit");
      throw InfeasiblePlanError(
          "no feasible plan exists (proven by the solver: " + sr.status + "). Relax the constraints: " +
          (p.usage_limit >= 0 ? "raise the memory limit (--memory-limit, memory_limit_bytes), " : std::string()) +
          (r.lowered.budget_index >= 0 ? "raise the parameter memory high bound (or lower the low one), "
                                       : std::string()) +
          "or remove input/output/node constraints");
    }
    solution = sr.solution;
    objective = ev.cost;
    bound = std::min(sr.lower_bound, ev.cost);
  } else {
    plan.solver_status = "trivial";
    plan.proven_optimal = true;
  }
  plan.choice = expand_solution(r.lowered, solution);
  plan.cost = evaluate_choice(r.sharding, plan.choice, cache);
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

}  // namespace

PlanningResult run_planner(const Graph& graph, const PlannerOptions& given) {
  validate_planner_options(given);
  PlannerOptions options = given;
  options.time_limit_s = checked_time_limit(given.time_limit_s, "time_limit_s");
  BuildLimits limits;
  limits.time_limit_s = options.time_limit_s;
  limits.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options.time_limit_s));
  if (options.max_problem_bytes > 0) {
    limits.max_bytes = options.max_problem_bytes;
    limits.cap_source = "set by --max-problem-bytes / max_problem_bytes";
  } else {
    limits.max_bytes = default_problem_memory_cap(&limits.cap_source);
  }
  try {
    return plan_within_limits(graph, options, limits);
  } catch (const std::bad_alloc&) {
    // The estimate is not exact; running out anyway still gets a message, not a bare bad_alloc.
    throw PlanningLimitError("ran out of memory while planning on mesh " + mesh_str(options.mesh) +
                             " (memory cap " + human_bytes(static_cast<double>(limits.max_bytes)) + ", " +
                             limits.cap_source + "); lower the cap with --max-problem-bytes / max_problem_bytes so "
                             "that such a problem is refused early, or use a mesh with fewer dimensions");
  }
}

Json plan_graph(const Graph& graph, const PlannerOptions& options) {
  PlanningResult r = run_planner(graph, options);
  Json j = plan_to_json(r.sharding, r.plan);
  j.set("report", Json::string(plan_report(r.sharding, r.plan, options.verbose)));
  return j;
}

std::string plan_graph_json(const std::string& graph_json, const std::string& options_json) {
  Json options_doc;
  try {
    options_doc = parse_json(options_json);
  } catch (const JsonError& e) {
    throw JsonError(std::string("options: ") + e.what());
  }
  PlannerOptions options = parse_planner_options(options_doc);
  Json graph_doc;
  try {
    graph_doc = parse_json(graph_json);
  } catch (const JsonError& e) {
    throw JsonError(std::string("graph: ") + e.what());
  }
  Graph graph = parse_graph(graph_doc);
  return plan_graph(graph, options).dump();
}

}  // namespace autoshard
