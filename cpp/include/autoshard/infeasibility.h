// Why a planning request has no plan: the user constraints that conflict (issue 11, item 7).
//
// When no plan exists (or none was found in time), the planner re-solves the request with
// constraints removed, one at a time (a deletion filter): a constraint whose removal leaves
// the request still proven infeasible is dropped for good, one whose removal gives a plan is
// kept. What stays is a conflicting set that is proven infeasible on its own and, when every
// probe finished, irreducible (removing any one member gives a plan). Each probe has a short
// time limit and the whole diagnosis a budget; probes that run out are reported as such.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autoshard/build_limits.h"
#include "autoshard/graph.h"
#include "autoshard/lowering.h"
#include "autoshard/planner.h"
#include "autoshard/strategy.h"

namespace autoshard {

// One constraint of a request that the diagnosis may remove.
struct UserConstraint {
  enum class Kind { Input, Output, Node, ParameterLow, ParameterHigh, MemoryLimit };
  Kind kind = Kind::Input;
  std::string name;       // Input / Node: the graph node's name
  int output_index = -1;  // Output: the forward output's index
};

// A cheap necessary condition that fails before solving: a node left without any strategy by
// the layouts fixed around it, a parameter-memory low bound above what the parameters can
// take, or a memory limit below the smallest possible peak. nullopt if none fails.
struct ObviousInfeasibility {
  std::string message;                        // names the condition and what to relax
  std::optional<UserConstraint::Kind> names;  // the one constraint the message names, if any
};
std::optional<ObviousInfeasibility> obvious_infeasibility(const ShardingModel& sm, const LoweredProblem& lp);

// The user constraints of a request in the order the diagnosis tries them: input, output and
// node constraints (graph order), then the parameter-memory bounds that restrict anything
// (low > 0, high < 1) and the memory limit.
std::vector<UserConstraint> user_constraints(const Graph& graph, const PlannerOptions& options,
                                             const std::optional<std::pair<double, double>>& parameter_memory);

// "input constraint on 'x' = (Shard(0), Replicate()) ["S(0)","R"]: forward input 0,
// placeholder float32[8,16]": the value, then the node's role or op, tensor, module and
// source line where the graph has them.
std::string describe_constraint(const Graph& graph, const PlannerOptions& options,
                                const std::optional<std::pair<double, double>>& parameter_memory,
                                const UserConstraint& c);

enum class ProbeOutcome { Feasible, Infeasible, Unknown };

struct InfeasibilityDiagnosis {
  // Whether the request is proven infeasible: by the planner, or by the diagnosis itself (a
  // single removal that still leaves no plan proves it). Only then is a conflict searched.
  bool request_proven = false;
  bool proven_by_diagnosis = false;
  std::vector<UserConstraint> constraints;  // all of them, in trial order
  // Indices into `constraints` of the conflicting set (request_proven); `set_proven`: the set
  // alone (every other constraint removed) was proven infeasible.
  std::vector<size_t> conflict;
  bool set_proven = false;
  // Per member of `conflict`: the set without it has a plan (shown by a probe).
  std::vector<bool> member_necessary;
  // Per entry of `constraints`: the whole request without that one constraint has a plan
  // (Feasible), still none (Infeasible), or its probe ran out of time / was not run.
  std::vector<ProbeOutcome> alone_fixes;
  // Constraints the filter could not decide (their probe ran out of time): kept in the set.
  std::vector<size_t> undecided;
  bool ran_out = false;  // the diagnosis budget ran out before every probe was done
  int probes = 0;
  double seconds = 0;
};

struct DiagnosisOptions {
  double budget_s = 1.0;  // the whole diagnosis (enumerating, building and solving probes)
  int64_t max_problem_bytes = INT64_MAX;
};

// Runs the diagnosis on `graph` under `options` (whose constraints applied cleanly).
// `request_proven`: the planner proved the full request infeasible; otherwise (its time ran
// out) the removal of each single constraint is probed first. Never throws for
// infeasibility or limits.
InfeasibilityDiagnosis diagnose_infeasibility(const Graph& graph, const PlannerOptions& options, bool request_proven,
                                              const DiagnosisOptions& dopt);

// The paragraphs appended to the planner's error: the conflicting constraints, each with its
// node, tensor and source line, whether the conflict is proven, and what to relax.
std::string format_diagnosis(const Graph& graph, const PlannerOptions& options, const InfeasibilityDiagnosis& d);

// The effective parameter-memory budget of `options` (the default is low 0, high 1/mesh size).
std::optional<std::pair<double, double>> effective_parameter_memory(const PlannerOptions& options);

}  // namespace autoshard
