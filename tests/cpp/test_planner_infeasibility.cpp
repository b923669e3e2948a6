// Requests without a plan name the constraints that conflict (issue 11, item 7): each with its
// node, tensor and source line, whether the conflict is proven, and which removal fixes it.
#include <gtest/gtest.h>

#include <functional>

#include "autoshard/infeasibility.h"
#include "autoshard/layout.h"
#include "autoshard/planner.h"

#include "test_data_paths.h"
#include "test_layout_util.h"
#include "test_planner_util.h"
#include "io/graph_json.h"

using namespace autoshard;

namespace {

// The planner's InfeasiblePlanError message ("" when it planned or threw something else).
std::string infeasible_message(const Graph& g, const PlannerOptions& o) {
  try {
    run_planner(g, o);
  } catch (const InfeasiblePlanError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The part of the message that lists the conflicting constraints.
std::string cause_of(const std::string& e) {
  size_t a = e.find("\nCause ("), b = e.find("\nFix: ");
  return a == std::string::npos || b == std::string::npos ? "" : e.substr(a, b - a);
}

}  // namespace

TEST(PlannerInfeasibility, SolverProvenConflictNamesExactlyTheConflictingConstraints) {
  // linear_fwd: x [1024,256] @ w^T -> mm [1024,512] (2 MiB unsharded), the forward output.
  // The output pinned Partial forces mm's output unsharded (Shard -> Partial is impossible),
  // which the memory limit does not hold; the input constraint agrees with both.
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  PlannerOptions o = planner_options({4});
  o.constraints.inputs["x"] = L({"S(1)"});
  o.constraints.outputs[0] = L({"P(sum)"});
  o.memory_limit_bytes = 1572864;
  std::string e = infeasible_message(g, o);
  EXPECT_TRUE(has(e, "no feasible plan exists (proven by the solver")) << e;
  const std::string cause = cause_of(e);
  EXPECT_TRUE(has(cause,
                  "Cause (proven: with every other constraint removed there is still no plan, and removing "
                  "any one of these gives a plan"))
      << e;
  EXPECT_TRUE(has(cause, "these 2 constraints cannot all hold:")) << e;
  EXPECT_TRUE(has(cause,
                  "\n  - output constraint on forward output 0 = (Partial(),) [\"P(sum)\"]: produced by node "
                  "'mm', aten.mm.default -> float32[1024,512]"))
      << e;
  EXPECT_TRUE(has(cause, "\n  - memory limit = 1572864 bytes per GPU")) << e;
  EXPECT_FALSE(has(cause, "input constraint")) << e;
  EXPECT_FALSE(has(cause, "parameter memory")) << e;  // the default high bound is not to blame
  EXPECT_TRUE(has(e,
                  "Fix: remove or relax the output constraint on output 0 or the memory limit: the request "
                  "without any one of them has a plan."))
      << e;
  // Each named removal does give a plan.
  PlannerOptions without_output = o;
  without_output.constraints.outputs.clear();
  EXPECT_NO_THROW(run_planner(g, without_output));
  PlannerOptions without_limit = o;
  without_limit.memory_limit_bytes = -1;
  EXPECT_NO_THROW(run_planner(g, without_limit));
  // Deterministic: the same request gives the same message (apart from the timing).
  auto strip = [](std::string s) {
    size_t a = s.find("; diagnosis: "), b = s.find("): ", a);
    return a == std::string::npos ? s : s.erase(a, b - a);
  };
  EXPECT_EQ(strip(infeasible_message(g, o)), strip(e));
}

TEST(PlannerInfeasibility, ObviousMemoryConflictWithAPinNamesThePinAndItsSourceLine) {
  // mlp2: mm [65536,1024] float32 is 256 MiB unsharded; pinned Replicate it cannot fit.
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options({4});
  o.constraints.inputs["primals_3"] = L({"S(0)"});  // what the plan would choose anyway
  o.constraints.nodes["mm"] = L({"R"});
  o.memory_limit_bytes = 300'000'000;
  std::string e = infeasible_message(g, o);
  // The cheap check's own message stays first, then the constraints behind it.
  EXPECT_TRUE(has(e, "no feasible plan: memory_limit_bytes=300000000 is below the smallest possible peak")) << e;
  const std::string cause = cause_of(e);
  EXPECT_TRUE(has(cause, "these 2 constraints cannot all hold:")) << e;
  EXPECT_TRUE(has(cause,
                  "\n  - node constraint on 'mm' = (Replicate(),) [\"R\"]: aten.mm.default -> "
                  "float32[65536,1024] in module w1, at mlp.py:10 in forward: h = torch.relu(self.w1(x))"))
      << e;
  EXPECT_TRUE(has(cause, "\n  - memory limit = 300000000 bytes per GPU")) << e;
  EXPECT_FALSE(has(cause, "primals_3")) << e;
  EXPECT_TRUE(has(e, "the request without any one of them has a plan")) << e;
}

TEST(PlannerInfeasibility, ParameterLowBoundAgainstMemoryLimitIsProvenBeforeSolving) {
  // Replicated parameters (low = high = 1, DDP-like) take 6 MiB more per GPU than sharded
  // ones; the limit leaves 3 MiB. The solver's search alone cannot prove this in its time.
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options({4});
  o.parameter_memory_default = false;
  o.parameter_memory = std::make_pair(1.0, 1.0);
  o.memory_limit_bytes = 274'581'188;
  std::string e = infeasible_message(g, o);
  EXPECT_TRUE(has(e,
                  "under the parameter memory low bound: the parameters, live the whole step, must take at least "
                  "8388608 bytes per GPU (they could take 2097152)"))
      << e;
  const std::string cause = cause_of(e);
  EXPECT_TRUE(has(cause, "Cause (proven")) << e;
  EXPECT_TRUE(has(cause, "\n  - parameter memory low bound = 1 ")) << e;
  EXPECT_TRUE(has(cause, "\n  - memory limit = 274581188 bytes per GPU")) << e;
  EXPECT_TRUE(has(e, "Fix: remove or relax the parameter memory low bound or the memory limit")) << e;
}

TEST(PlannerInfeasibility, ImpossibleRedistributionBetweenPinsNamesBothPins) {
  // mm pinned Shard(0) and its output pinned Partial: Shard -> Partial does not exist.
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  PlannerOptions o = planner_options({4});
  o.constraints.nodes["mm"] = L({"S(0)"});
  o.constraints.outputs[0] = L({"P(sum)"});
  std::string e = infeasible_message(g, o);
  EXPECT_TRUE(has(e, "needs a redistribution that is impossible")) << e;
  const std::string cause = cause_of(e);
  EXPECT_TRUE(has(cause, "these 2 constraints cannot all hold:")) << e;
  EXPECT_TRUE(has(cause, "output constraint on forward output 0 = (Partial(),)")) << e;
  EXPECT_TRUE(has(cause, "node constraint on 'mm' = (Shard(0),)")) << e;
}

TEST(PlannerInfeasibility, SingleCauseMessagesStayAsTheyWere) {
  // Only the memory limit is to blame (the default parameter bound is not): the cheap check's
  // message already names it, and nothing is added.
  Graph g = read_graph_file(test_data("mlp2_fwd_bwd.json"));
  PlannerOptions o = planner_options({4});
  o.memory_limit_bytes = 1000;
  std::string e = infeasible_message(g, o);
  EXPECT_TRUE(has(e, "memory_limit_bytes=1000 is below the smallest possible peak of 271581188 bytes per GPU")) << e;
  EXPECT_TRUE(has(e, "raise memory_limit_bytes or use a larger mesh")) << e;
  EXPECT_FALSE(has(e, "Cause")) << e;
}

TEST(PlannerInfeasibility, DiagnosisReportsWhatItEstablishedWhenItsTimeRunsOut) {
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  PlannerOptions o = planner_options({4});
  o.constraints.inputs["x"] = L({"S(1)"});
  o.constraints.outputs[0] = L({"P(sum)"});
  o.memory_limit_bytes = 1572864;
  DiagnosisOptions none;
  none.budget_s = 0;  // no time at all: nothing is removed, the whole request stays
  InfeasibilityDiagnosis d = diagnose_infeasibility(g, o, true, none);
  EXPECT_TRUE(d.ran_out);
  EXPECT_EQ(d.conflict.size(), d.constraints.size());
  std::string text = format_diagnosis(g, o, d);
  EXPECT_TRUE(has(text, "[not established whether it is needed: the diagnosis ran out of time on it]")) << text;
  EXPECT_TRUE(has(text,
                  "The diagnosis time ran out before every probe was done: the constraints above are proven "
                  "to conflict, but the set may not be minimal"))
      << text;
  // With time it finds the two (the input constraint and the default parameter bound go).
  DiagnosisOptions some;
  some.budget_s = 5;
  d = diagnose_infeasibility(g, o, true, some);
  EXPECT_FALSE(d.ran_out);
  ASSERT_EQ(d.conflict.size(), 2u);
  EXPECT_EQ(d.constraints[d.conflict[0]].kind, UserConstraint::Kind::Output);
  EXPECT_EQ(d.constraints[d.conflict[1]].kind, UserConstraint::Kind::MemoryLimit);
  EXPECT_EQ(d.member_necessary, (std::vector<bool>{true, true}));
}

TEST(PlannerInfeasibility, WhenTheSolverRanOutOfTimeTheDiagnosisCanProveInfeasibility) {
  // As if the solver had stopped at its time limit: the first probe (without the input
  // constraint) is proven infeasible, which proves the whole request infeasible too.
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  PlannerOptions o = planner_options({4});
  o.constraints.inputs["x"] = L({"S(1)"});
  o.constraints.outputs[0] = L({"P(sum)"});
  o.memory_limit_bytes = 1572864;
  DiagnosisOptions dopt;
  dopt.budget_s = 5;
  InfeasibilityDiagnosis d = diagnose_infeasibility(g, o, false, dopt);
  EXPECT_TRUE(d.request_proven);
  EXPECT_TRUE(d.proven_by_diagnosis);
  std::string text = format_diagnosis(g, o, d);
  EXPECT_TRUE(has(text, "\nThe diagnosis proved that no plan exists, so more time would not help.\nCause (proven"))
      << text;
  EXPECT_TRUE(has(text, "these 2 constraints cannot all hold:")) << text;
  EXPECT_FALSE(has(cause_of(text), "input constraint")) << text;
}

TEST(PlannerInfeasibility, WithoutAProofItSaysWhichRemovalsGiveAPlan) {
  // A request the solver did not decide in time (here: one that has plans): each constraint
  // is removed in turn and those whose removal gives a plan are named, as not proven.
  Graph g = read_graph_file(test_data("linear_fwd.json"));
  PlannerOptions o = planner_options({4});
  o.constraints.inputs["x"] = L({"S(1)"});
  DiagnosisOptions dopt;
  dopt.budget_s = 5;
  InfeasibilityDiagnosis d = diagnose_infeasibility(g, o, false, dopt);
  EXPECT_FALSE(d.request_proven);
  ASSERT_EQ(d.alone_fixes.size(), 2u);  // the input constraint, the default parameter bound
  EXPECT_EQ(d.alone_fixes[0], ProbeOutcome::Feasible);
  std::string text = format_diagnosis(g, o, d);
  EXPECT_TRUE(has(text, "\nEach constraint removed in turn (diagnosis: ")) << text;
  EXPECT_TRUE(has(text,
                  "without the input constraint on 'x' or without the parameter memory high bound a plan is "
                  "found, so each of these makes the request infeasible or too hard for the time limit (not "
                  "proven):\n  - input constraint on 'x' = (Shard(1),) [\"S(1)\"]: forward input 0, "
                  "placeholder float32[1024,256]\n  - parameter memory high bound = 0.25 (the default"))
      << text;
  EXPECT_TRUE(has(text, "raise the time limit")) << text;
}
