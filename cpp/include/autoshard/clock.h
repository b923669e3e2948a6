// The one clock of the planner and the solver: monotonic wall time, and a time limit
// measured from a start.
#pragma once

#include <chrono>

namespace autoshard {

using Clock = std::chrono::steady_clock;

// Seconds as a double, both ways (clock durations are integer ticks).
inline double to_seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline Clock::duration from_seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

inline double seconds_since(Clock::time_point t) { return to_seconds(Clock::now() - t); }

// A time limit counted from `start`.
struct Deadline {
  Clock::time_point start = Clock::now();
  double limit_s = 1e30;
  double elapsed() const { return seconds_since(start); }
  bool passed() const { return elapsed() >= limit_s; }
};

}  // namespace autoshard
