// `autoshard solve PROBLEM.json[.gz]`: read and check a solver problem, solve it with the
// memory limit enforced at every time point, write the plan, and report it. The reported
// plan is re-evaluated here, independently of the solver, before anything is printed.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <stdexcept>
#include <string>

#include "autoshard/cli.h"
#include "autoshard/evaluate.h"
#include "autoshard/problem_io.h"
#include "autoshard/solver.h"

namespace autoshard {

namespace {

const char* kSolveUsage =
    "usage: autoshard solve PROBLEM.json[.gz] [--time-limit SECONDS] [--threads N]\n"
    "                       [--work-limit UNITS] [--gap-tolerance FRACTION] [--out SOLUTION.json]\n"
    "                       [--exact] [--seed N] [--verbose]\n"
    "  --time-limit SECONDS  wall-clock limit, including reading (default 60)\n"
    "  --threads N           independent searches run in parallel, best plan kept (default 1)\n"
    "  --work-limit UNITS    stop the search after this much counted work instead of at the\n"
    "                        clock: the same plan on any machine (the time limit still holds;\n"
    "                        each run prints the work it did)\n"
    "  --gap-tolerance F     stop once the plan is within this fraction of the lower bound\n"
    "                        (default 0: a proof of optimality or a limit; the planner uses 0.001)\n"
    "  --out PATH            write {\"solution\": [...]} to PATH\n"
    "  --exact               prove optimality (branch and bound) within the time limit\n"
    "  --seed N              seed for randomised search (default 0)\n"
    "  --verbose             progress on stderr\n";

struct UsageError {
  std::string message;
};

// Exact: integers in full, other values in the shortest form that reads back to the same
// double (never rounded to 6 digits, which hid differences between plans).
std::string format_cost(double c) {
  if (std::nearbyint(c) == c && std::fabs(c) < 9.2e18) return std::to_string(static_cast<int64_t>(c));
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, c);
  return std::string(buf, r.ptr);
}

// With integer costs the optimum is an integer, so a fractional bound rounds up (less the
// floating-point noise the solver allows for) and prints as an integer.
double integral_bound(double lb, bool integer_costs) {
  return integer_costs ? std::ceil(lb - optimality_tolerance(lb, true)) : lb;
}

int64_t parse_int(const std::string& opt, const std::string& v) {
  int64_t x = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), x);
  if (r.ec != std::errc() || r.ptr != v.data() + v.size())
    throw UsageError{opt + " expects an integer, got '" + v + "'"};
  return x;
}

}  // namespace

int cmd_solve(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string path, out_path;
  SolveOptions opt;
  try {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto value = [&]() -> const std::string& {
        if (i + 1 >= args.size()) throw UsageError{a + " needs a value"};
        return args[++i];
      };
      if (a == "-h" || a == "--help") {
        out << kSolveUsage;
        return 0;
      } else if (a == "--time-limit") {
        const std::string& v = value();
        double t = 0;
        auto r = std::from_chars(v.data(), v.data() + v.size(), t);  // inf/nan: judged below
        if (r.ec != std::errc() || r.ptr != v.data() + v.size())
          throw UsageError{"--time-limit expects a number of seconds, got '" + v + "'"};
        try {
          opt.time_limit_s = checked_time_limit(t, "--time-limit");
        } catch (const std::invalid_argument& e) {
          throw UsageError{e.what()};
        }
      } else if (a == "--threads") {
        int64_t t = parse_int(a, value());
        if (t < 1 || t > 1024) throw UsageError{"--threads must be between 1 and 1024"};
        opt.threads = static_cast<int>(t);
      } else if (a == "--work-limit") {
        const int64_t w = parse_int(a, value());
        if (w < 1) throw UsageError{"--work-limit must be >= 1 (it counts units of search work)"};
        opt.work_limit = w;
      } else if (a == "--gap-tolerance") {
        const std::string& v = value();
        double f = 0;
        auto r = std::from_chars(v.data(), v.data() + v.size(), f);
        if (r.ec != std::errc() || r.ptr != v.data() + v.size())
          throw UsageError{"--gap-tolerance expects a fraction, got '" + v + "'"};
        try {
          opt.gap_tolerance = checked_gap_tolerance(f, "--gap-tolerance");
        } catch (const std::invalid_argument& e) {
          throw UsageError{e.what()};
        }
      } else if (a == "--out") {
        out_path = value();
      } else if (a == "--exact") {
        opt.exact = true;
      } else if (a == "--seed") {
        int64_t s = parse_int(a, value());
        if (s < 0) throw UsageError{"--seed must be >= 0"};
        opt.seed = static_cast<uint64_t>(s);
      } else if (a == "--verbose") {
        opt.verbose = true;
      } else if (!a.empty() && a[0] == '-') {
        throw UsageError{"unknown option '" + a + "'"};
      } else if (path.empty()) {
        path = a;
      } else {
        throw UsageError{"more than one problem file given ('" + path + "' and '" + a + "')"};
      }
    }
    if (path.empty()) throw UsageError{"missing PROBLEM file"};
    if (!out_path.empty()) {
      try {
        check_output_path(path, out_path, "--out");
      } catch (const std::invalid_argument& e) {
        throw UsageError{e.what()};
      }
    }
  } catch (const UsageError& e) {
    err << "autoshard solve: " << e.message << "\n" << kSolveUsage;
    return 2;
  }

  const auto started = std::chrono::steady_clock::now();
  Problem problem;
  try {
    problem = read_problem(path);
  } catch (const std::exception& e) {
    err << "autoshard solve: error: " << e.what() << "\n";
    return 1;
  }
  size_t strategies = 0;
  for (size_t i = 0; i < problem.num_nodes(); ++i) strategies += problem.num_strategies(i);
  out << "problem: " << path << " (" << problem.num_nodes() << " nodes, " << problem.edges.size() << " edges, "
      << strategies << " strategies";
  if (problem.usage_limit >= 0) out << ", usage limit " << problem.usage_limit;
  if (!problem.budgets.empty()) out << ", " << problem.budgets.size() << " budget(s)";
  out << ")\n";

  // The time limit covers reading too (as in the IOPDDL contest); the solver gets the rest,
  // but always a little time to produce a plan.
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double requested_s = opt.time_limit_s;
  opt.time_limit_s = std::max(0.05 * requested_s, requested_s - read_s);
  SolveResult r = solve(problem, opt);
  r.total_time_s += read_s;
  if (r.time_to_first_s >= 0) r.time_to_first_s += read_s;

  // Independent re-check of what the solver claims.
  Evaluation ev;
  if (r.found) ev = evaluate(problem, r.solution);
  const bool integer_costs = has_integer_costs(problem);
  if (!r.found || !ev.valid) {
    out << "status: " << (r.found ? "the solver's plan failed the independent check: " + ev.violation : r.status) << "\n";
    out << "no valid plan found";
    if (r.lower_bound > -kInfeasibleCost && r.lower_bound < kInfeasibleCost)
      out << " (lower bound " << format_cost(integral_bound(r.lower_bound, integer_costs)) << ")";
    out << "\n";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", r.total_time_s);
    out << "total time: " << buf << " s\n";
    err << "autoshard solve: no valid plan found for '" << path << "': ";
    if (r.found)
      err << "the solver's plan failed the independent check (" << ev.violation << "); this is a solver bug, please "
          << "report it with the problem file\n";
    else if (r.proven_infeasible)
      err << "none exists (proven: " << r.status << "); the usage limit, budgets and infeasible costs "
          << "cannot all be met\n";
    else
      err << "the time limit (" << requested_s << " s) ran out first and infeasibility was not proven; "
          << "raise --time-limit\n";
    return 3;
  }
  char buf[128];
  out << "status: " << r.status << "\n";
  out << "cost: " << format_cost(ev.cost) << "\n";
  if (problem.usage_limit >= 0) {
    std::snprintf(buf, sizeof buf, " (%.1f%%)", 100.0 * static_cast<double>(ev.peak_usage) /
                                                    static_cast<double>(std::max<int64_t>(1, problem.usage_limit)));
    out << "peak memory: " << ev.peak_usage << " / limit " << problem.usage_limit << buf << "\n";
  } else {
    out << "peak memory: " << ev.peak_usage << " (no limit)\n";
  }
  for (size_t b = 0; b < problem.budgets.size(); ++b)
    out << "budget " << (problem.budgets[b].name.empty() ? std::to_string(b) : problem.budgets[b].name) << ": "
        << ev.budget_sums[b] << " in [" << problem.budgets[b].low << ", " << problem.budgets[b].high << "]\n";
  double lb = std::min(integral_bound(r.lower_bound, integer_costs), ev.cost);
  if (lb > -kInfeasibleCost) {
    out << "lower bound: " << format_cost(lb) << "\n";
    double gap = ev.cost > 0 ? (ev.cost - lb) / ev.cost : 0.0;
    std::snprintf(buf, sizeof buf, "%.4f%%", 100.0 * gap);
    out << "gap: " << buf << "\n";
  } else {
    out << "lower bound: none\n";
  }
  std::snprintf(buf, sizeof buf, "%.3f", r.time_to_first_s);
  out << "time to first valid plan: " << buf << " s\n";
  std::snprintf(buf, sizeof buf, "%.3f", r.total_time_s);
  out << "total time: " << buf << " s (reading " << [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", read_s);
    return std::string(b);
  }() << " s)\n";
  if (r.work > 0) out << "search work: " << r.work << " units\n";
  if (r.proven_optimal) out << "proven optimal\n";
  if (!out_path.empty()) {
    try {
      write_solution(r.solution, out_path);
    } catch (const std::exception& e) {
      err << "autoshard solve: error: " << e.what() << "\n";
      return 1;
    }
    out << "solution written to " << out_path << "\n";
  }
  return 0;
}

}  // namespace autoshard
