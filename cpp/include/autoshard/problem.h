// The solver problem: the waist between the sharding model and the solver.
//
// It is the IOPDDL form (shared/bench/iopddl/README.md): nodes pick one strategy each, a
// strategy has a cost and a memory usage live over the node's [start, end) interval, edges
// carry |S_u| x |S_v| cost matrices, and the usage of live nodes must stay within a limit at
// every time point. Beyond IOPDDL it carries global budgets (a sum over all nodes with a lower
// and upper bound: AutoParallel's parameter-memory constraint, counted in bytes here).
// Ties and pins are lowered into it as infeasible edge entries and infeasible node costs, so
// the solver needs no special case for them.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace autoshard {

// Costs are doubles: IOPDDL costs are integers below 2^53 (exact in a double) and the PyTorch
// path costs are microseconds. A cost >= kInfeasibleCost marks a forbidden choice.
using Cost = double;
inline constexpr Cost kInfeasibleCost = 1e18;
inline bool is_infeasible(Cost c) { return !(c < kInfeasibleCost); }

// 2^53: every integer up to here is exact in a double, so integer plan costs whose terms add
// up to at most this are summed, compared and printed exactly. validate_problem refuses
// problems whose finite costs could add up to more (rounding would order plans wrongly).
inline constexpr Cost kMaxExactCost = 9007199254740992.0;

// How far a lower bound may sit below a plan's cost and still prove the plan optimal. It only
// absorbs floating-point noise in the bound: with integer costs never a whole unit, since a
// plan one unit cheaper would otherwise be missed while "optimal" is claimed.
inline constexpr Cost kIntegerNoise = 0.25;  // the most noise forgiven with integer costs
inline Cost optimality_tolerance(Cost cost, bool integer_costs) {
  const Cost rel = 1e-9 * (cost < 0 ? -cost : cost);
  return integer_costs && rel > kIntegerNoise ? kIntegerNoise : rel;
}

// With integer costs the optimum is an integer at or above any lower bound, so a bound less
// than one unit (less the noise allowed above) below a plan's cost leaves no cheaper plan.
inline constexpr Cost kIntegerProofGap = 1 - kIntegerNoise;

// Whether a lower bound proves a plan of `cost` optimal: with integer costs, the bound rounded
// up meets the cost; otherwise it is within floating-point noise of it.
inline bool bound_proves_optimal(Cost cost, Cost lower_bound, bool integer_costs) {
  if (integer_costs) return cost - lower_bound < kIntegerProofGap;
  return cost - lower_bound <= optimality_tolerance(cost, false);
}

struct Interval {
  int64_t start = 0;  // inclusive
  int64_t end = 0;    // exclusive; end == start means never live
};

struct Edge {
  int32_t u = 0;  // producer node
  int32_t v = 0;  // consumer node
  // Row-major |S_u| x |S_v|: costs[su * |S_v| + sv].
  std::vector<Cost> costs;
};

// A constraint on the sum of usages of the chosen strategies of all nodes (no time
// dimension): low <= sum <= high.
struct GlobalBudget {
  std::string name;
  std::vector<std::vector<int64_t>> usage;  // [node][strategy]; an empty row means 0
  int64_t low = 0;
  int64_t high = std::numeric_limits<int64_t>::max();
};

struct Problem {
  std::string name;
  std::vector<std::vector<Cost>> node_costs;      // [node][strategy]
  std::vector<std::vector<int64_t>> node_usages;  // [node][strategy]; an empty row means 0
  std::vector<Interval> intervals;                // [node]
  std::vector<Edge> edges;
  // At every time t: sum of usages of nodes whose interval contains t <= usage_limit.
  // A negative limit means "no limit".
  int64_t usage_limit = -1;
  std::vector<GlobalBudget> budgets;
  // Optional names, for reports (empty or one per node).
  std::vector<std::string> node_names;

  size_t num_nodes() const { return node_costs.size(); }
  size_t num_strategies(size_t node) const { return node_costs[node].size(); }
};

// A problem that breaks the invariants below, or a problem file that cannot be read; the
// message names the source, the field and what to do.
class ProblemError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Checks the invariants every solver relies on (sizes, ranges, usages >= 0, ...).
// Throws ProblemError naming the first violation. read_problem calls it.
void validate_problem(const Problem& problem, const std::string& source = "problem");

// Whether every finite cost is an integer (IOPDDL problems): the optimum is then an integer.
bool has_integer_costs(const Problem& problem);

// One strategy index per node.
using Solution = std::vector<int32_t>;

}  // namespace autoshard
