// Diagnosis of requests without a plan: which user constraints conflict (infeasibility.h).
#include <fmt/format.h>

#include "autoshard/infeasibility.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "autoshard/clock.h"
#include "autoshard/layout.h"
#include "autoshard/solver.h"

namespace autoshard {

namespace {

std::string num(double v) { return fmt::format("{:g}", v); }

// DTensor spelling, as users write constraints in Python: (Shard(0), Replicate()).
std::string placement_py(const Placement& p) {
  if (p.is_shard()) return "Shard(" + std::to_string(p.dim) + ")";
  if (p.is_replicate()) return "Replicate()";
  switch (p.reduce) {
    case ReduceOp::Sum:
      return "Partial()";
    case ReduceOp::Avg:
      return "Partial(\"avg\")";
    case ReduceOp::Max:
      return "Partial(\"max\")";
    case ReduceOp::Min:
      return "Partial(\"min\")";
  }
  return "Partial()";
}

std::string layout_py(const Layout& l) {
  std::string s = "(";
  for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + placement_py(l[i]);
  return s + (l.size() == 1 ? ",)" : ")");
}

std::string tensor_str(const Node& n) {
  for (const auto& o : n.outputs)
    if (o) return std::string(dtype_name(o->dtype)) + shape_str(o->shape);
  return "no tensor";
}

// "aten.mm.default -> float32[1024,512] in module w1, at mlp.py:10 in forward: h = ..."
std::string node_where(const Node& n) {
  std::string s;
  if (n.op == "placeholder") {
    switch (n.role) {
      case NodeRole::Parameter:
        s = "parameter " + n.fqn + ", ";
        break;
      case NodeRole::Buffer:
        s = "buffer " + n.fqn + ", ";
        break;
      case NodeRole::Input:
        s = "forward input " + std::to_string(n.input_index) + ", ";
        break;
      case NodeRole::Tangent:
        s = "tangent of output " + std::to_string(n.tangent_of) + ", ";
        break;
      case NodeRole::Compute:
        break;
    }
    s += "placeholder " + tensor_str(n);
  } else {
    s = n.op + " -> " + tensor_str(n);
  }
  if (!n.module.empty()) s += " in module " + n.module;
  if (!n.source.empty()) s += ", at " + n.source;
  return s;
}

const Layout* pinned_layout(const std::map<std::string, Layout>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

// A short name for fix lines: "the input constraint on 'x'", "the memory limit".
std::string short_label(const UserConstraint& c) {
  switch (c.kind) {
    case UserConstraint::Kind::Input:
      return "the input constraint on '" + c.name + "'";
    case UserConstraint::Kind::Output:
      return "the output constraint on output " + std::to_string(c.output_index);
    case UserConstraint::Kind::Node:
      return "the node constraint on '" + c.name + "'";
    case UserConstraint::Kind::ParameterLow:
      return "the parameter memory low bound";
    case UserConstraint::Kind::ParameterHigh:
      return "the parameter memory high bound";
    case UserConstraint::Kind::MemoryLimit:
      return "the memory limit";
  }
  return "?";
}

// Counted work of a probe's first, machine-independent search: a few hundredths of a second
// on a small graph.
constexpr int64_t kProbeWork = 20'000'000;

// Re-plans the request with a subset of its constraints: strategies are enumerated once.
class Prober {
 public:
  Prober(const Graph& graph, const PlannerOptions& options, const std::vector<UserConstraint>& cs,
         const std::optional<std::pair<double, double>>& pm, const DiagnosisOptions& dopt, Clock::time_point deadline)
      : graph_(graph),
        options_(options),
        cs_(cs),
        pm_(pm),
        deadline_(deadline),
        model_(std::make_unique<MeshModel>(MeshModel::make(options.mesh, options.hardware))),
        cache_(std::make_unique<RedistributionCache>(*model_)) {
    limits_.deadline = deadline;
    limits_.time_limit_s = dopt.budget_s;
    limits_.max_bytes = dopt.max_problem_bytes;
    limits_.cap_source = "the planner's memory cap";
    strategies_ = enumerate_strategies(graph, *model_, &limits_);
  }

  // Outcome of the request keeping the constraints with keep[i]; memoised.
  ProbeOutcome run(const std::vector<bool>& keep, double limit_s, int* probes) {
    auto it = memo_.find(keep);
    if (it != memo_.end()) return it->second;
    ++*probes;
    ProbeOutcome r = solve_subset(keep, limit_s);
    // Out-of-time answers depend on the limit; only proofs and plans are remembered.
    if (r != ProbeOutcome::Unknown) memo_[keep] = r;
    return r;
  }

 private:
  ProbeOutcome solve_subset(const std::vector<bool>& keep, double limit_s) {
    const auto start = Clock::now();
    const auto probe_deadline = std::min(deadline_, start + from_seconds(limit_s));
    PlacementConstraints pc;
    LoweringOptions lo;
    lo.parameter_memory = pm_;
    lo.memory_limit_bytes = options_.memory_limit_bytes;
    for (size_t i = 0; i < cs_.size(); ++i) {
      const UserConstraint& c = cs_[i];
      switch (c.kind) {
        case UserConstraint::Kind::Input:
          if (keep[i]) pc.inputs[c.name] = options_.constraints.inputs.at(c.name);
          break;
        case UserConstraint::Kind::Output:
          if (keep[i]) pc.outputs[c.output_index] = options_.constraints.outputs.at(c.output_index);
          break;
        case UserConstraint::Kind::Node:
          if (keep[i]) pc.nodes[c.name] = options_.constraints.nodes.at(c.name);
          break;
        case UserConstraint::Kind::ParameterLow:
          if (!keep[i]) lo.parameter_memory->first = 0.0;
          break;
        case UserConstraint::Kind::ParameterHigh:
          if (!keep[i]) lo.parameter_memory->second = 1.0;
          break;
        case UserConstraint::Kind::MemoryLimit:
          if (!keep[i]) lo.memory_limit_bytes = -1;
          break;
      }
    }
    if (lo.parameter_memory && lo.parameter_memory->second < lo.parameter_memory->first)
      lo.parameter_memory->second = lo.parameter_memory->first;
    BuildLimits limits = limits_;
    limits.deadline = probe_deadline;
    lo.limits = &limits;
    try {
      ShardingModel sm = build_sharding_model(graph_, *model_, strategies_, pc);
      LoweredProblem lp = lower_to_problem(sm, lo, *cache_);
      if (obvious_infeasibility(sm, lp)) return ProbeOutcome::Infeasible;
      if (lp.problem.num_nodes() == 0) return ProbeOutcome::Feasible;
      // Any plan answers a probe, not the best one: first a search cut by counted work (the
      // same answer on any machine; the large-problem search would otherwise improve its plan
      // until the clock stops it), then, if that found nothing, the rest of the probe's time.
      for (int64_t work_limit : {kProbeWork, int64_t{0}}) {
        const double left = to_seconds(probe_deadline - Clock::now());
        if (left <= 0) break;
        SolveOptions so;
        so.time_limit_s = left;
        so.work_limit = work_limit;
        so.gap_tolerance = 0.99;  // any plan answers: stop at the first one with a bound
        SolveResult sr = solve(lp.problem, so);
        if (sr.found) return ProbeOutcome::Feasible;
        if (sr.proven_infeasible) return ProbeOutcome::Infeasible;
      }
      return ProbeOutcome::Unknown;
    } catch (const InfeasibleLayoutsError&) {
      return ProbeOutcome::Infeasible;
    } catch (const PlanningLimitError&) {
      return ProbeOutcome::Unknown;
    } catch (const std::bad_alloc&) {
      return ProbeOutcome::Unknown;
    }
  }

  const Graph& graph_;
  const PlannerOptions& options_;
  const std::vector<UserConstraint>& cs_;
  std::optional<std::pair<double, double>> pm_;
  Clock::time_point deadline_;
  std::unique_ptr<MeshModel> model_;
  std::unique_ptr<RedistributionCache> cache_;
  BuildLimits limits_;
  std::vector<std::vector<Strategy>> strategies_;
  std::map<std::vector<bool>, ProbeOutcome> memo_;
};

}  // namespace

std::optional<std::pair<double, double>> effective_parameter_memory(const PlannerOptions& options) {
  if (options.parameter_memory_default)
    return std::make_pair(0.0, 1.0 / static_cast<double>(std::max<int64_t>(1, options.mesh.size())));
  return options.parameter_memory;
}

std::optional<ObviousInfeasibility> obvious_infeasibility(const ShardingModel& sm, const LoweredProblem& lp) {
  const Problem& p = lp.problem;
  const Graph& g = *sm.graph;
  for (size_t s = 0; s < p.num_nodes(); ++s) {
    bool any = std::any_of(p.node_costs[s].begin(), p.node_costs[s].end(), [](Cost c) { return !is_infeasible(c); });
    if (!any) {
      int32_t gi = lp.graph_node[s];
      return ObviousInfeasibility{"no feasible plan: node '" + g.nodes[gi].name + "' (" + g.nodes[gi].op + ")" +
                                      (sm.pinned[gi] ? " (it is pinned by a constraint)" : "") +
                                      " has no strategy compatible with the fixed layouts around it; relax the "
                                      "input/output/node constraints on it or its neighbours",
                                  std::nullopt};
    }
  }
  if (lp.budget_index >= 0) {
    const GlobalBudget& b = p.budgets[lp.budget_index];
    int64_t most = 0;
    for (const auto& row : b.usage)
      if (!row.empty()) most += *std::max_element(row.begin(), row.end());
    if (most < b.low)
      return ObviousInfeasibility{"no feasible plan: parameter_memory low asks for at least " + std::to_string(b.low) +
                                      " parameter bytes per GPU but the parameters take at "
                                      "most " +
                                      std::to_string(most) +
                                      " (as replicated as their constraints allow); "
                                      "lower parameter_memory.low",
                                  UserConstraint::Kind::ParameterLow};
  }
  if (p.usage_limit >= 0) {
    // Smallest possible live usage at each time point. Parameters are live the whole step, so
    // under a parameter-memory budget they add at least max(their smallest bytes, its low
    // bound) at every point, whichever layouts the other tensors take.
    const GlobalBudget* budget = lp.budget_index >= 0 ? &p.budgets[lp.budget_index] : nullptr;
    auto is_param = [&](size_t s) { return budget && !budget->usage[s].empty(); };
    auto live_interval = [&](size_t s) {
      return !p.node_usages[s].empty() && p.intervals[s].end > p.intervals[s].start;
    };
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (size_t s = 0; s < p.num_nodes(); ++s)
      if (live_interval(s)) {
        first = std::min(first, p.intervals[s].start);
        last = std::max(last, p.intervals[s].end);
      }
    bool params_whole_step = budget != nullptr;
    for (size_t s = 0; s < p.num_nodes() && params_whole_step; ++s)
      if (is_param(s) && !(live_interval(s) && p.intervals[s].start <= first && p.intervals[s].end >= last))
        params_whole_step = false;
    std::map<int64_t, int64_t> delta;
    int64_t params = 0;  // smallest bytes of all parameters together (params_whole_step)
    for (size_t s = 0; s < p.num_nodes(); ++s) {
      if (!live_interval(s)) continue;
      int64_t m = *std::min_element(p.node_usages[s].begin(), p.node_usages[s].end());
      if (params_whole_step && is_param(s)) {
        params += m;
        continue;
      }
      if (m == 0) continue;
      delta[p.intervals[s].start] += m;
      delta[p.intervals[s].end] -= m;
    }
    int64_t live = 0, peak = 0, at = first == INT64_MAX ? 0 : first;
    for (const auto& [t, d] : delta) {
      live += d;
      if (live > peak) {
        peak = live;
        at = t;
      }
    }
    const int64_t low = params_whole_step ? budget->low : 0;
    std::string where = at < static_cast<int64_t>(g.nodes.size()) ? " (at node '" + g.nodes[at].name + "')" : "";
    if (peak + params > p.usage_limit)
      return ObviousInfeasibility{"no feasible plan: memory_limit_bytes=" + std::to_string(p.usage_limit) +
                                      " is below the smallest possible peak of " + std::to_string(peak + params) +
                                      " bytes per GPU" + where +
                                      " even with every tensor as sharded as its "
                                      "constraints allow; raise memory_limit_bytes or use a larger mesh",
                                  UserConstraint::Kind::MemoryLimit};
    if (peak + low > p.usage_limit)
      return ObviousInfeasibility{
          "no feasible plan: memory_limit_bytes=" + std::to_string(p.usage_limit) +
              " is below the smallest possible peak of " + std::to_string(peak + low) + " bytes per GPU" + where +
              " under the parameter memory low bound: the "
              "parameters, live the whole step, must take at least " +
              std::to_string(low) + " bytes per GPU (they could take " + std::to_string(params) +
              "); lower "
              "parameter_memory.low or raise memory_limit_bytes",
          std::nullopt};
  }
  return std::nullopt;
}

std::vector<UserConstraint> user_constraints(const Graph& graph, const PlannerOptions& options,
                                             const std::optional<std::pair<double, double>>& pm) {
  std::vector<UserConstraint> out;
  // Pins in graph order (the order of the model), inputs first.
  std::vector<std::pair<int32_t, UserConstraint>> pins;
  auto index = [&](const std::string& name) {
    auto it = graph.index_by_name.find(name);
    return it == graph.index_by_name.end() ? INT32_MAX : it->second;
  };
  for (const auto& [name, layout] : options.constraints.inputs)
    pins.push_back({index(name), {UserConstraint::Kind::Input, name, -1}});
  std::sort(pins.begin(), pins.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [i, c] : pins) out.push_back(std::move(c));
  for (const auto& [idx, layout] : options.constraints.outputs) out.push_back({UserConstraint::Kind::Output, "", idx});
  pins.clear();
  for (const auto& [name, layout] : options.constraints.nodes)
    pins.push_back({index(name), {UserConstraint::Kind::Node, name, -1}});
  std::sort(pins.begin(), pins.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [i, c] : pins) out.push_back(std::move(c));
  if (pm) {
    if (pm->first > 0) out.push_back({UserConstraint::Kind::ParameterLow, "", -1});
    if (pm->second < 1) out.push_back({UserConstraint::Kind::ParameterHigh, "", -1});
  }
  if (options.memory_limit_bytes >= 0) out.push_back({UserConstraint::Kind::MemoryLimit, "", -1});
  return out;
}

std::string describe_constraint(const Graph& graph, const PlannerOptions& options,
                                const std::optional<std::pair<double, double>>& pm, const UserConstraint& c) {
  auto node = [&](const std::string& name) -> const Node* {
    auto it = graph.index_by_name.find(name);
    return it == graph.index_by_name.end() ? nullptr : &graph.nodes[it->second];
  };
  switch (c.kind) {
    case UserConstraint::Kind::Input:
    case UserConstraint::Kind::Node: {
      const bool input = c.kind == UserConstraint::Kind::Input;
      const Layout* l = pinned_layout(input ? options.constraints.inputs : options.constraints.nodes, c.name);
      std::string s = std::string(input ? "input" : "node") + " constraint on '" + c.name +
                      "' = " + (l ? layout_py(*l) + " " + layout_list_str(*l) : std::string("?"));
      if (const Node* n = node(c.name)) s += ": " + node_where(*n);
      return s;
    }
    case UserConstraint::Kind::Output: {
      auto it = options.constraints.outputs.find(c.output_index);
      std::string s =
          "output constraint on forward output " + std::to_string(c.output_index) + " = " +
          (it != options.constraints.outputs.end() ? layout_py(it->second) + " " + layout_list_str(it->second)
                                                   : std::string("?"));
      for (const auto& o : graph.outputs)
        if (o.role == GraphOutput::Role::Output && o.output_index == c.output_index) {
          const Node& n = graph.nodes[o.ref.node];
          s += ": produced by node '" + n.name + "', " + node_where(n);
          break;
        }
      return s;
    }
    case UserConstraint::Kind::ParameterLow:
      return "parameter memory low bound = " + num(pm ? pm->first : 0) +
             " (each GPU holds at least this fraction of every parameter's bytes; parameter_memory.low, "
             "--param-memory LOW, add_parameter_memory_constraint(low=...))";
    case UserConstraint::Kind::ParameterHigh:
      return "parameter memory high bound = " + num(pm ? pm->second : 1) +
             (options.parameter_memory_default ? " (the default, 1/mesh size, used when no parameter memory "
                                                 "constraint is given"
                                               : " (parameter_memory.high, --param-memory HIGH, "
                                                 "add_parameter_memory_constraint(high=...)") +
             "; each GPU holds at most this fraction of every parameter's bytes)";
    case UserConstraint::Kind::MemoryLimit:
      return "memory limit = " + std::to_string(options.memory_limit_bytes) + " bytes per GPU (" +
             (options.memory_limit_bytes >= 1'000'000
                  ? human_bytes(static_cast<double>(options.memory_limit_bytes)) + "; "
                  : std::string()) +
             "memory_limit_bytes, --memory-limit)";
  }
  return "?";
}

InfeasibilityDiagnosis diagnose_infeasibility(const Graph& graph, const PlannerOptions& options, bool request_proven,
                                              const DiagnosisOptions& dopt) {
  const auto start = Clock::now();
  const auto deadline = start + from_seconds(std::max(0.0, dopt.budget_s));
  InfeasibilityDiagnosis d;
  d.request_proven = request_proven;
  const auto pm = effective_parameter_memory(options);
  d.constraints = user_constraints(graph, options, pm);
  const size_t n = d.constraints.size();
  auto left = [&] { return to_seconds(deadline - Clock::now()); };
  // Each probe gets an equal share of the budget (at least a tenth of it), never past the end.
  const double per_probe = std::max(dopt.budget_s / static_cast<double>(2 * n + 1), 0.1 * dopt.budget_s);
  auto finish = [&] {
    d.seconds = seconds_since(start);
    return d;
  };
  if (n == 0) {
    if (request_proven) d.set_proven = true;
    return finish();
  }
  std::unique_ptr<Prober> prober;
  try {
    prober = std::make_unique<Prober>(graph, options, d.constraints, pm, dopt, deadline);
  } catch (const PlanningLimitError&) {
    d.ran_out = true;
  } catch (const std::bad_alloc&) {
    d.ran_out = true;
  }
  auto probe = [&](const std::vector<bool>& k) {
    if (!prober || left() <= 0) {
      d.ran_out = true;
      return ProbeOutcome::Unknown;
    }
    return prober->run(k, std::min(per_probe, left()), &d.probes);
  };
  auto without = [](std::vector<bool> k, size_t i) {
    k[i] = false;
    return k;
  };

  std::vector<bool> keep(n, true), decided(n, false);
  d.alone_fixes.assign(n, ProbeOutcome::Unknown);
  if (!request_proven) {
    // Nothing proven: which single removal gives a plan? One that is proven to leave none
    // proves the whole request infeasible (it only adds a constraint back; an output
    // constraint is not a pure addition, it replaces the default Replicate target).
    for (size_t i = 0; i < n && !d.ran_out; ++i) {
      d.alone_fixes[i] = probe(without(keep, i));
      if (d.alone_fixes[i] == ProbeOutcome::Infeasible && d.constraints[i].kind != UserConstraint::Kind::Output) {
        d.request_proven = d.proven_by_diagnosis = true;
        keep[i] = false;
        decided[i] = true;
        break;
      }
    }
    if (!d.request_proven) return finish();
  }

  // Deletion filter: drop every constraint whose removal keeps the request proven infeasible,
  // so `keep` is always a set that a probe (or the planner) proved infeasible.
  for (size_t i = 0; i < n && !d.ran_out; ++i) {
    if (decided[i]) continue;
    ProbeOutcome r = probe(without(keep, i));
    if (d.ran_out) break;
    decided[i] = true;
    if (r == ProbeOutcome::Infeasible)
      keep[i] = false;
    else if (r == ProbeOutcome::Unknown)
      d.undecided.push_back(i);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!keep[i]) continue;
    d.conflict.push_back(i);
    // Constraints the filter never reached (out of budget) stay in the set, undecided.
    if (!decided[i] && std::find(d.undecided.begin(), d.undecided.end(), i) == d.undecided.end())
      d.undecided.push_back(i);
  }
  std::sort(d.undecided.begin(), d.undecided.end());
  d.set_proven = true;
  // Each member: does the final set without it have a plan (mostly answered from the memo)?
  for (size_t i : d.conflict) d.member_necessary.push_back(probe(without(keep, i)) == ProbeOutcome::Feasible);
  // And does the whole request without it have one?
  for (size_t i : d.conflict)
    if (d.alone_fixes[i] == ProbeOutcome::Unknown) d.alone_fixes[i] = probe(without(std::vector<bool>(n, true), i));
  return finish();
}

std::string format_diagnosis(const Graph& graph, const PlannerOptions& options, const InfeasibilityDiagnosis& d) {
  const auto pm = effective_parameter_memory(options);
  auto describe = [&](size_t i) { return describe_constraint(graph, options, pm, d.constraints[i]); };
  auto label = [&](size_t i) { return short_label(d.constraints[i]); };
  auto join = [](const std::vector<std::string>& v, const char* last) {
    std::string r;
    for (size_t i = 0; i < v.size(); ++i) r += (i ? (i + 1 == v.size() ? last : ", ") : "") + v[i];
    return r;
  };
  const std::string budget =
      fmt::format("diagnosis: {} probe{} in {:.2g} s", d.probes, d.probes == 1 ? "" : "s", d.seconds);
  std::string s;

  if (!d.request_proven) {
    if (d.constraints.empty()) return "";
    std::vector<size_t> fixes;
    for (size_t i = 0; i < d.alone_fixes.size(); ++i)
      if (d.alone_fixes[i] == ProbeOutcome::Feasible) fixes.push_back(i);
    s += "\nEach constraint removed in turn (" + std::string(budget) + "): ";
    if (fixes.empty()) {
      s += "no single removal gave a plan within the probes' time either, so infeasibility is not proven: raise "
           "the time limit.";
      if (d.ran_out) s += " (The diagnosis time ran out before every constraint was tried.)";
      return s;
    }
    std::vector<std::string> labels;
    for (size_t i : fixes) labels.push_back(label(i));
    s += "without " + join(labels, " or without ") + " a plan is found, so " +
         (fixes.size() == 1 ? "this constraint makes" : "each of these makes") +
         " the request infeasible or too hard for the time limit (not proven):";
    for (size_t i : fixes) s += "\n  - " + describe(i);
    s += "\nRelax " + std::string(fixes.size() == 1 ? "it" : "one of them") +
         ", or raise the time limit to let the solver find a plan or prove that none exists.";
    return s;
  }

  if (d.conflict.empty()) {
    s += "\nCause (" + std::string(budget) + "): ";
    if (d.constraints.empty())
      s += "the request has no input/output/node constraint, parameter memory bound or memory limit, so the cause "
           "is not a constraint: no layout assignment of this graph works on this mesh; please report this with "
           "the graph.";
    else
      s += "even with every constraint removed there is no plan (proven), so the cause is not a constraint you "
           "gave but the graph on this mesh (e.g. mixed-precision casts that must stay local); please report this "
           "with the graph.";
    return s;
  }

  const size_t k = d.conflict.size();
  const bool irreducible = std::all_of(d.member_necessary.begin(), d.member_necessary.end(), [](bool b) { return b; });
  if (d.proven_by_diagnosis) s += "\nThe diagnosis proved that no plan exists, so more time would not help.";
  s += "\nCause (proven: with every other constraint removed there is still no plan";
  if (irreducible)
    s += k == 1 ? ", and without this one there is a plan" : ", and removing any one of these gives a plan";
  s += "; " + std::string(budget) + "): ";
  s += k == 1 ? "this constraint cannot be met:" : "these " + std::to_string(k) + " constraints cannot all hold:";
  for (size_t m = 0; m < k; ++m) {
    s += "\n  - " + describe(d.conflict[m]);
    if (!d.member_necessary[m])
      s += std::find(d.undecided.begin(), d.undecided.end(), d.conflict[m]) != d.undecided.end()
               ? " [not established whether it is needed: the diagnosis ran out of time on it]"
               : " [not shown to be needed]";
  }
  // The fix: which single removal gives a plan for the whole request.
  std::vector<std::string> alone, not_alone;
  for (size_t i : d.conflict) {
    if (d.alone_fixes[i] == ProbeOutcome::Feasible)
      alone.push_back(label(i));
    else if (d.alone_fixes[i] == ProbeOutcome::Infeasible)
      not_alone.push_back(label(i));
  }
  s += "\nFix: ";
  if (!alone.empty()) {
    s += "remove or relax " + join(alone, " or ") + ": the request without " +
         (alone.size() == 1 ? "it" : "any one of them") + " has a plan.";
    if (!not_alone.empty())
      s += " Without " + join(not_alone, " or without ") + " alone there is still another conflict.";
  } else if (!not_alone.empty()) {
    s += "relax these, but removing any single one still leaves another conflict (proven); relax several and plan "
         "again.";
  } else {
    s += "remove or relax one of them (whether that alone is enough was not established in the diagnosis time).";
  }
  if (d.ran_out)
    s += "\nThe diagnosis time ran out before every probe was done: the constraints above are proven to conflict, "
         "but the set may not be minimal; a larger time limit (time_limit_s, --time-limit) gives the diagnosis more "
         "time too.";
  return s;
}

}  // namespace autoshard
