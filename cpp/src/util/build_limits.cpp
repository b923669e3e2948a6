// Time and memory limits while building the solver problem (build_limits.h).
#include <fmt/format.h>

#include "autoshard/build_limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace autoshard {

std::string human_bytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.1f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.0f} bytes", bytes);
}

void BuildLimits::check_time(const std::string& stage) const {
  if (Clock::now() < deadline) return;
  throw PlanningLimitError("the time limit (" + fmt::format("{:g}", time_limit_s) +
                           " s, --time-limit / time_limit_s) ran out while " + stage +
                           ", before the solver started; raise the time limit, or use a mesh with fewer "
                           "dimensions (strategies per node grow exponentially with them)");
}

void BuildLimits::reserve(int64_t bytes, const std::string& what) {
  strategy_bytes += bytes;
  if (strategy_bytes <= max_bytes) return;
  throw PlanningLimitError(what + " is estimated to need " + human_bytes(static_cast<double>(strategy_bytes)) +
                           ", above the memory cap of " + human_bytes(static_cast<double>(max_bytes)) + " (" +
                           cap_source +
                           "); use a mesh with fewer dimensions (strategies per node grow "
                           "exponentially with them), or raise the cap with --max-problem-bytes / max_problem_bytes "
                           "if the machine has the memory");
}

namespace {

// Bytes from a "Key:   123 kB" line of a /proc file; -1 when absent (not Linux, no such key).
int64_t proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) {
      try {
        return std::stoll(line.substr(key.size())) * 1024;
      } catch (const std::exception&) {
        return -1;
      }
    }
  return -1;
}

}  // namespace

int64_t default_problem_memory_cap(std::string* source) {
  int64_t cap = 8'000'000'000;
  std::string why = "the default of 8 GB";
  // `ulimit -v`: what the address space may still grow by.
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const int64_t used = std::max<int64_t>(0, proc_kb("/proc/self/status", "VmSize:"));
    const int64_t room = static_cast<int64_t>(0.8 * static_cast<double>(static_cast<int64_t>(rl.rlim_cur) - used));
    if (room < cap) {
      cap = std::max<int64_t>(room, 1);
      why = "80% of the address space this process may still use under its limit (ulimit -v)";
    }
  }
  const int64_t available = proc_kb("/proc/meminfo", "MemAvailable:");
  if (available > 0 && static_cast<int64_t>(0.8 * static_cast<double>(available)) < cap) {
    cap = static_cast<int64_t>(0.8 * static_cast<double>(available));
    why = "80% of the memory the system reports available";
  }
  if (source) *source = why;
  return cap;
}

}  // namespace autoshard
