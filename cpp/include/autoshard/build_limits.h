// Limits on building the solver problem from a graph: wall-clock time and memory.
//
// Strategies per node grow as (rows per mesh dim)^(mesh dims) and cost tables as the product
// of two nodes' strategy counts, so a 5-D mesh can ask for tens of GB and minutes before the
// solver starts. The planner estimates the size from the strategy counts before it builds
// the tables and refuses beyond a cap, and checks the clock while building, so such a request
// ends in a message naming the estimate, the cap and the way out, never in std::bad_alloc or
// a run far past the time limit.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "autoshard/clock.h"

namespace autoshard {

// Raised when building the problem would exceed the memory cap or the time limit.
class PlanningLimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Measured peak memory of lowering + solving per cost-table entry was 28-41 bytes (an 8-byte
// cost in the lowering, its copy in the problem, reductions and solver views); 48 leaves room.
inline constexpr int64_t kBytesPerTableEntry = 48;

struct BuildLimits {
  Clock::time_point deadline = Clock::time_point::max();
  double time_limit_s = 0;  // for messages
  int64_t max_bytes = INT64_MAX;
  std::string cap_source;      // how max_bytes was chosen, for messages
  int64_t strategy_bytes = 0;  // running total of enumerated strategies (estimated)

  // Throws PlanningLimitError when the deadline passed; `stage` says what was being built.
  void check_time(const std::string& stage) const;
  // Adds `bytes` to the estimate of what is being built and throws PlanningLimitError when
  // it would pass the cap; `what` names it. release() gives back what was not needed.
  void reserve(int64_t bytes, const std::string& what);
  void release(int64_t bytes) { strategy_bytes -= bytes; }
};

// The default memory cap: 8 GB, lowered to 80% of what this process may still allocate
// (address-space limit, `ulimit -v`) and of the memory the system reports available.
// `source` receives a short description of which bound applied.
int64_t default_problem_memory_cap(std::string* source);

// "13.6 GB"-style byte counts for messages.
std::string human_bytes(double bytes);

}  // namespace autoshard
