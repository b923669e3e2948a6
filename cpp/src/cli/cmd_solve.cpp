// `autoshard solve PROBLEM.json[.gz]`: read and check a solver problem, solve it with the
// memory limit enforced at every time point, write the plan, and report it. The reported
// plan is re-evaluated here, independently of the solver, before anything is printed.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ostream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "autoshard/cli.h"
#include "autoshard/clock.h"
#include "autoshard/evaluate.h"
#include "autoshard/problem_io.h"
#include "autoshard/solver.h"
#include "cli_args.h"

namespace autoshard {

namespace {

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

struct SolveArgs {
  std::string path, out_path;
  std::string time_limit, threads, work_limit, gap_tolerance, seed;
  SolveOptions opt;
};

void define(CLI::App& app, SolveArgs& a) {
  cli::configure(app);
  app.description(
      "Solve a solver problem (IOPDDL JSON, optionally gzip) with the memory limit enforced at every\n"
      "time point; the plan is re-checked independently before it is reported.");
  app.add_option("PROBLEM", a.path, "the problem file (PROBLEM.json or PROBLEM.json.gz)")->type_name("");
  app.add_option("--time-limit", a.time_limit, "wall-clock limit, including reading (default 60)")
      ->type_name("SECONDS");
  app.add_option("--threads", a.threads, "independent searches run in parallel, best plan kept (default 1)")
      ->type_name("N");
  app.add_option("--work-limit", a.work_limit,
                 "stop the search after this much counted work instead of at the clock:\n"
                 "the same plan on any machine (the time limit still holds; each run prints\n"
                 "the work it did)")
      ->type_name("UNITS");
  app.add_option("--gap-tolerance", a.gap_tolerance,
                 "stop once the plan is within this fraction of the lower bound (default 0:\n"
                 "a proof of optimality or a limit; the planner uses 0.001)")
      ->type_name("F");
  app.add_option("--out", a.out_path, "write {\"solution\": [...]} to PATH")->type_name("PATH");
  app.add_flag("--exact", a.opt.exact, "prove optimality (branch and bound) within the time limit");
  app.add_option("--seed", a.seed, "seed for randomised search (default 0)")->type_name("N");
  app.add_flag("--verbose", a.opt.verbose, "progress on stderr");
  app.add_option("--milp-log", a.opt.milp_log, "append HiGHS's own log of the MILP runs to PATH (diagnostics)")
      ->type_name("PATH");
}

// The option texts into SolveOptions; every error is a UsageError naming the option.
void convert(const CLI::App& app, SolveArgs& a) {
  cli::reject_extras(app, a.path, "problem file");
  try {
    if (!a.time_limit.empty())
      a.opt.time_limit_s =
          checked_time_limit(cli::to_double(a.time_limit, "--time-limit", "a number of seconds"), "--time-limit");
    if (!a.threads.empty()) {
      const int64_t t = cli::to_int(a.threads, "--threads");
      if (t < 1 || t > 1024) throw std::invalid_argument("--threads must be between 1 and 1024");
      a.opt.threads = static_cast<int>(t);
    }
    if (!a.work_limit.empty()) {
      const int64_t w = cli::to_int(a.work_limit, "--work-limit");
      if (w < 1) throw std::invalid_argument("--work-limit must be >= 1 (it counts units of search work)");
      a.opt.work_limit = w;
    }
    if (!a.gap_tolerance.empty())
      a.opt.gap_tolerance =
          checked_gap_tolerance(cli::to_double(a.gap_tolerance, "--gap-tolerance", "a fraction"), "--gap-tolerance");
    if (!a.seed.empty()) {
      const int64_t s = cli::to_int(a.seed, "--seed");
      if (s < 0) throw std::invalid_argument("--seed must be >= 0");
      a.opt.seed = static_cast<uint64_t>(s);
    }
    if (a.path.empty()) throw std::invalid_argument("missing PROBLEM file");
    if (!a.out_path.empty()) check_output_path(a.path, a.out_path, "--out");
    if (!a.opt.milp_log.empty()) check_output_path(a.path, a.opt.milp_log, "--milp-log");
  } catch (const std::invalid_argument& e) {
    throw cli::UsageError{e.what()};
  }
}

}  // namespace

int cmd_solve(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app("", "autoshard solve");
  SolveArgs a;
  define(app, a);
  try {
    if (!cli::parse(app, args)) {
      out << app.help();
      return 0;
    }
    convert(app, a);
  } catch (const cli::UsageError& e) {
    err << "autoshard solve: " << e.message << "\n" << app.help();
    return 2;
  }
  const std::string& path = a.path;
  const std::string& out_path = a.out_path;
  SolveOptions& opt = a.opt;

  const auto started = Clock::now();
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
  const double read_s = seconds_since(started);
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
    out << "status: " << (r.found ? "the solver's plan failed the independent check: " + ev.violation : r.status)
        << "\n";
    out << "no valid plan found";
    if (r.lower_bound > -kInfeasibleCost && r.lower_bound < kInfeasibleCost)
      out << " (lower bound " << format_cost(integral_bound(r.lower_bound, integer_costs)) << ")";
    out << "\n";
    out << fmt::format("total time: {:.3f} s\n", r.total_time_s);
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
  out << "status: " << r.status << "\n";
  out << "cost: " << format_cost(ev.cost) << "\n";
  if (problem.usage_limit >= 0) {
    out << fmt::format(
        "peak memory: {} / limit {} ({:.1f}%)\n", ev.peak_usage, problem.usage_limit,
        100.0 * static_cast<double>(ev.peak_usage) / static_cast<double>(std::max<int64_t>(1, problem.usage_limit)));
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
    out << fmt::format("gap: {:.4f}%\n", 100.0 * gap);
  } else {
    out << "lower bound: none\n";
  }
  out << fmt::format("time to first valid plan: {:.3f} s\n", r.time_to_first_s);
  out << fmt::format("total time: {:.3f} s (reading {:.3f} s)\n", r.total_time_s, read_s);
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
