// `autoshard plan GRAPH.json --mesh 8x8 [...]`: plan a traced tensor graph and print the report.
#include <cmath>
#include <fstream>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "autoshard/cli.h"
#include "autoshard/planner.h"
#include "autoshard/problem_io.h"
#include "autoshard/report.h"
#include "autoshard/solver.h"
#include "cli_args.h"
#include "io/graph_json.h"
#include "io/hardware_json.h"
#include "io/plan_json.h"

namespace autoshard {

namespace {

struct PlanArgs {
  std::string graph_path, out_path, problem_path;
  std::string mesh, dim_names, hardware, memory_limit, max_problem_bytes, time_limit, gap_tolerance;
  std::string repeated_layers, recompute;
  // --param-memory LOW,HIGH and --no-param-memory: the last one given wins.
  std::optional<std::optional<std::string>> param_memory;
  bool verbose = false;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, sep);) out.push_back(p);
  return out;
}

void define(CLI::App& app, PlanArgs& a) {
  cli::configure(app);
  app.description("Plan a traced tensor graph on a device mesh and print the report.");
  app.add_option("GRAPH", a.graph_path, "the tensor graph (GRAPH.json[.gz], docs/formats.md section 1)")->type_name("");
  app.add_option("--mesh", a.mesh, "mesh shape, sizes joined by 'x' (e.g. 64 or 8x8); required")->type_name("SHAPE");
  app.add_option("--dim-names", a.dim_names, "mesh dim names joined by ',' (e.g. dp,tp)")->type_name("NAMES");
  app.add_option("--hardware", a.hardware,
                 "a built-in profile (default H100) or a JSON object of profile fields\n"
                 "('{\"base\": \"CPU\", ...}')")
      ->type_name("PROFILE");
  app.add_option_function<std::string>(
         "--param-memory", [&a](const std::string& v) { a.param_memory = std::optional<std::string>(v); },
         "parameter memory per GPU as fractions of the total (default 0,1/mesh size;\n"
         "HIGH can not be below 1/mesh size)")
      ->type_name("LOW,HIGH")
      ->trigger_on_parse();
  app.add_flag_function(
         "--no-param-memory", [&a](std::int64_t) { a.param_memory = std::optional<std::string>(); },
         "no parameter memory constraint")
      ->trigger_on_parse();
  app.add_option("--memory-limit", a.memory_limit,
                 "peak bytes per GPU (> 0): the solver's limit and the one recomputation\n"
                 "fits the plan to (default: the hardware's memory less 10%, for recomputation only)")
      ->type_name("BYTES");
  app.add_option("--recompute", a.recompute,
                 "what the backward recomputes: auto (only what the memory limit needs; default),\n"
                 "none, reshard (every block gathers its gathered weights and activations again),\n"
                 "selective (every block keeps matmul and attention outputs) or full")
      ->type_name("auto|none|reshard|selective|full");
  app.add_option("--time-limit", a.time_limit, "seconds for building the problem and solving it (default 20)")
      ->type_name("SECONDS");
  app.add_option("--gap-tolerance", a.gap_tolerance,
                 "stop once the plan is within this fraction of the lower bound\n"
                 "(default 0.001; 0: only a proof of optimality or the time limit stops it)")
      ->type_name("FRACTION");
  app.add_option("--repeated-layers", a.repeated_layers,
                 "identical repeated layers: tie (one strategy for all copies), untie (each\n"
                 "layer planned on its own) or auto (tie when the untied problem is large; default)")
      ->type_name("auto|tie|untie");
  app.add_option("--max-problem-bytes", a.max_problem_bytes,
                 "refuse to plan when the strategy tables and solver problem are estimated\n"
                 "to need more memory than this (default 4e9)")
      ->type_name("BYTES");
  app.add_option("--out", a.out_path, "write the plan JSON there (the report is printed either way)")
      ->type_name("PLAN.json");
  app.add_option("--problem-out", a.problem_path,
                 "also write the solver problem (IOPDDL JSON with budgets; docs/formats.md\n"
                 "section 4) there, for `autoshard solve`")
      ->type_name("PROBLEM.json");
  app.add_flag("--verbose", a.verbose, "progress on stderr and a longer report");
}

// A positive whole number of bytes, written as an integer or like 8e10.
int64_t to_bytes(const std::string& s, const std::string& what) {
  const double v = cli::to_double(s, what);
  if (!(v > 0)) throw std::invalid_argument(what + ": must be > 0 bytes, got '" + s + "'");
  if (!(v < 9.2e18) || std::nearbyint(v) != v)
    throw std::invalid_argument(what + ": '" + s + "' is not a whole number of bytes below 9.2e18");
  return static_cast<int64_t>(v);
}

Mesh to_mesh(const std::string& m, const std::string& dim_names) {
  const std::string bad = "--mesh: '" + m + "' is not sizes >= 1 joined by 'x' (e.g. 64 or 8x8)";
  Mesh mesh;
  for (const auto& p : split(m, 'x')) {
    int64_t s = 0;
    try {
      s = cli::to_int(p, "--mesh");
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(bad);
    }
    if (s < 1) throw std::invalid_argument(bad);
    mesh.shape.push_back(s);
  }
  if (mesh.shape.empty() || m.back() == 'x') throw std::invalid_argument(bad);
  if (!dim_names.empty()) mesh.dim_names = split(dim_names, ',');
  return mesh;
}

// The option texts into PlannerOptions. Values that do not convert or are out of range throw
// std::invalid_argument (exit code 1, as for any planning error).
PlannerOptions to_options(const PlanArgs& a) {
  PlannerOptions o;
  o.mesh = to_mesh(a.mesh, a.dim_names);
  if (a.param_memory) {
    o.parameter_memory_default = false;
    if (*a.param_memory) {
      auto parts = split(**a.param_memory, ',');
      if (parts.size() != 2) throw std::invalid_argument("--param-memory expects LOW,HIGH (e.g. 0,0.125)");
      const double low = cli::to_double(parts[0], "--param-memory low");
      const double high = cli::to_double(parts[1], "--param-memory high");
      if (!(low >= 0 && low <= high && high <= 1))
        throw std::invalid_argument("--param-memory: need 0 <= LOW <= HIGH <= 1");
      // HIGH against 1/mesh size is checked with the mesh (validate_planner_options).
      o.parameter_memory = std::make_pair(low, high);
    }
  }
  // -1 once meant "no limit" by accident; no limit is the default, so leave the option out.
  if (!a.memory_limit.empty())
    o.memory_limit_bytes = to_bytes(a.memory_limit, "--memory-limit (leave it out for no limit)");
  if (!a.max_problem_bytes.empty()) o.max_problem_bytes = to_bytes(a.max_problem_bytes, "--max-problem-bytes");
  if (!a.time_limit.empty())
    o.time_limit_s =
        checked_time_limit(cli::to_double(a.time_limit, "--time-limit", "a number of seconds"), "--time-limit");
  if (!a.gap_tolerance.empty())
    o.gap_tolerance =
        checked_gap_tolerance(cli::to_double(a.gap_tolerance, "--gap-tolerance", "a fraction"), "--gap-tolerance");
  if (!a.repeated_layers.empty()) o.repeated_layers = parse_layer_tying(a.repeated_layers, "--repeated-layers");
  if (!a.recompute.empty()) o.recompute = parse_recompute_mode(a.recompute, "--recompute");
  o.verbose = a.verbose;
  return o;
}

void write_plan(const Json& plan, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write '" + path + "'");
  f << dump_json(plan, 1) << "\n";
  if (!f.flush()) throw std::runtime_error("error while writing '" + path + "' (disk full?)");
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app("", "autoshard plan");
  PlanArgs a;
  define(app, a);
  try {
    if (!cli::parse(app, args)) {
      out << app.help();
      return 0;
    }
  } catch (const cli::UsageError& e) {
    // An option without its value is an error in the command, as a bad value is (exit 1).
    throw std::invalid_argument(e.message);
  }
  try {
    cli::reject_extras(app, a.graph_path, "graph file");
    if (a.graph_path.empty() || a.mesh.empty())
      throw cli::UsageError{a.graph_path.empty() ? "no graph file given" : "--mesh is required"};
  } catch (const cli::UsageError& e) {
    err << "autoshard plan: " << e.message << "\n" << app.help();
    return 2;
  }
  PlannerOptions o = to_options(a);
  if (!a.out_path.empty()) check_output_path(a.graph_path, a.out_path, "--out");
  if (!a.problem_path.empty()) check_output_path(a.graph_path, a.problem_path, "--problem-out");
  validate_planner_options(o);
  if (!a.hardware.empty()) o.hardware = hardware_profile_from_text(a.hardware);
  Graph graph = read_graph_file(a.graph_path);
  Json plan;
  if (a.problem_path.empty()) {
    plan = plan_graph(graph, o);
  } else {
    PlanningResult r = run_planner(graph, o);
    write_problem(r.lowered.problem, a.problem_path);
    plan = plan_to_json(r.sharding, r.plan);
    plan["report"] = plan_report(r.sharding, r.plan, o.verbose);
  }
  out << json_string(plan["report"]);
  if (!a.problem_path.empty()) out << "solver problem written to " << a.problem_path << "\n";
  if (!a.out_path.empty()) {
    write_plan(plan, a.out_path);
    out << "plan written to " << a.out_path << "\n";
  }
  return 0;
}

}  // namespace autoshard
