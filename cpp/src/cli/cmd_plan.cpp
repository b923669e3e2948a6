// `autoshard plan GRAPH.json --mesh 8x8 [...]`: plan a traced tensor graph and print the report.
#include <charconv>
#include <cmath>
#include <fstream>
#include <ostream>
#include <sstream>

#include "autoshard/cli.h"
#include "autoshard/planner.h"
#include "autoshard/problem_io.h"
#include "autoshard/report.h"
#include "autoshard/solver.h"

namespace autoshard {

namespace {

const char* kUsage =
    "usage: autoshard plan GRAPH.json[.gz] --mesh 8x8 [--dim-names dp,tp] [--hardware H100]\n"
    "                      [--param-memory LOW,HIGH | --no-param-memory] [--memory-limit BYTES]\n"
    "                      [--time-limit SECONDS] [--gap-tolerance FRACTION] [--max-problem-bytes BYTES]\n"
    "                      [--out PLAN.json] [--problem-out PROBLEM.json] [--verbose]\n"
    "  --mesh          mesh shape, sizes joined by 'x' (e.g. 64 or 8x8)\n"
    "  --param-memory  parameter memory per GPU as fractions of the total (default 0,1/mesh size;\n"
    "                  HIGH can not be below 1/mesh size)\n"
    "  --memory-limit  bytes per GPU (> 0; leave it out for no limit)\n"
    "  --time-limit    seconds for building the problem and solving it (default 20)\n"
    "  --gap-tolerance stop once the plan is within this fraction of the lower bound\n"
    "                  (default 0.001; 0: only a proof of optimality or the time limit stops it)\n"
    "  --max-problem-bytes  refuse to plan when the strategy tables and solver problem are\n"
    "                  estimated to need more memory than this (default 4e9)\n"
    "  --out           write the plan JSON there (the report is printed either way)\n"
    "  --problem-out   also write the solver problem (IOPDDL JSON with budgets; docs/formats.md\n"
    "                  section 4) there, for `autoshard solve`\n";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, sep);) out.push_back(p);
  return out;
}

// Whole-string numbers only ("4e9" is fine, "4GB" or "" is not); inf and nan pass here and
// are judged by the option that reads them.
double parse_double(const std::string& s, const std::string& what) {
  double v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) throw std::invalid_argument(what + ": '" + s + "' is not a number");
  return v;
}

// A positive whole number of bytes, written as an integer or like 8e10.
int64_t parse_bytes(const std::string& s, const std::string& what) {
  const double v = parse_double(s, what);
  if (!(v > 0)) throw std::invalid_argument(what + ": must be > 0 bytes, got '" + s + "'");
  if (!(v < 9.2e18) || std::nearbyint(v) != v)
    throw std::invalid_argument(what + ": '" + s + "' is not a whole number of bytes below 9.2e18");
  return static_cast<int64_t>(v);
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string graph_path, out_path, problem_path;
  PlannerOptions o;
  bool have_mesh = false;
  auto value = [&](size_t& i) -> const std::string& {
    if (i + 1 >= args.size()) throw std::invalid_argument(args[i] + " needs a value");
    return args[++i];
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") { out << kUsage; return 0; }
    if (a == "--mesh") {
      const std::string& m = value(i);
      for (const auto& p : split(m, 'x')) {
        int64_t s = 0;
        auto r = std::from_chars(p.data(), p.data() + p.size(), s);
        if (r.ec != std::errc() || r.ptr != p.data() + p.size() || s < 1)
          throw std::invalid_argument("--mesh: '" + m + "' is not sizes >= 1 joined by 'x' (e.g. 64 or 8x8)");
        o.mesh.shape.push_back(s);
      }
      if (o.mesh.shape.empty() || m.back() == 'x')
        throw std::invalid_argument("--mesh: '" + m + "' is not sizes >= 1 joined by 'x' (e.g. 64 or 8x8)");
      have_mesh = true;
    } else if (a == "--dim-names") {
      o.mesh.dim_names = split(value(i), ',');
    } else if (a == "--hardware") {
      o.hardware = value(i);
    } else if (a == "--param-memory") {
      auto parts = split(value(i), ',');
      if (parts.size() != 2) throw std::invalid_argument("--param-memory expects LOW,HIGH (e.g. 0,0.125)");
      o.parameter_memory_default = false;
      o.parameter_memory = std::make_pair(parse_double(parts[0], "--param-memory low"),
                                          parse_double(parts[1], "--param-memory high"));
      if (!(o.parameter_memory->first >= 0 && o.parameter_memory->first <= o.parameter_memory->second &&
            o.parameter_memory->second <= 1))
        throw std::invalid_argument("--param-memory: need 0 <= LOW <= HIGH <= 1");
      // HIGH against 1/mesh size is checked with the mesh (validate_planner_options).
    } else if (a == "--no-param-memory") {
      o.parameter_memory_default = false;
      o.parameter_memory.reset();
    } else if (a == "--memory-limit") {
      // -1 once meant "no limit" by accident; no limit is the default, so leave the option out.
      o.memory_limit_bytes = parse_bytes(value(i), "--memory-limit (leave it out for no limit)");
    } else if (a == "--max-problem-bytes") {
      o.max_problem_bytes = parse_bytes(value(i), "--max-problem-bytes");
    } else if (a == "--time-limit") {
      o.time_limit_s = checked_time_limit(parse_double(value(i), "--time-limit"), "--time-limit");
    } else if (a == "--gap-tolerance") {
      o.gap_tolerance = checked_gap_tolerance(parse_double(value(i), "--gap-tolerance"), "--gap-tolerance");
    } else if (a == "--out") {
      out_path = value(i);
    } else if (a == "--problem-out") {
      problem_path = value(i);
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (!a.empty() && a[0] == '-') {
      err << "autoshard plan: unknown option '" << a << "'\n" << kUsage;
      return 2;
    } else if (graph_path.empty()) {
      graph_path = a;
    } else {
      err << "autoshard plan: more than one graph file given\n" << kUsage;
      return 2;
    }
  }
  if (graph_path.empty() || !have_mesh) {
    err << "autoshard plan: " << (graph_path.empty() ? "no graph file given" : "--mesh is required") << "\n" << kUsage;
    return 2;
  }
  if (!out_path.empty()) check_output_path(graph_path, out_path, "--out");
  if (!problem_path.empty()) check_output_path(graph_path, problem_path, "--problem-out");
  validate_planner_options(o);
  Graph graph = read_graph_file(graph_path);
  Json plan;
  if (problem_path.empty()) {
    plan = plan_graph(graph, o);
  } else {
    PlanningResult r = run_planner(graph, o);
    write_problem(r.lowered.problem, problem_path);
    plan = plan_to_json(r.sharding, r.plan);
    plan.set("report", Json::string(plan_report(r.sharding, r.plan, o.verbose)));
  }
  out << plan.at("report").as_string();
  if (!problem_path.empty()) out << "solver problem written to " << problem_path << "\n";
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    if (!f) throw std::runtime_error("cannot write '" + out_path + "'");
    f << plan.dump(1) << "\n";
    if (!f.flush()) throw std::runtime_error("error while writing '" + out_path + "' (disk full?)");
    out << "plan written to " << out_path << "\n";
  }
  return 0;
}

}  // namespace autoshard
