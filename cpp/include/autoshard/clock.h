// The one clock of the planner and the solver: monotonic wall time, and a time limit
// measured from a start.
#pragma once

#include <chrono>

namespace autoshard {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A time limit counted from `start`.
struct Deadline {
  Clock::time_point start = Clock::now();
  double limit_s = 1e30;
  double elapsed() const { return seconds_since(start); }
  bool passed() const { return elapsed() >= limit_s; }
};

}  // namespace autoshard
