// `autoshard plan GRAPH.json --mesh 8x8 [...]`: plan a traced tensor graph and print the report.
#include <fstream>
#include <ostream>
#include <sstream>

#include "autoshard/cli.h"
#include "autoshard/planner.h"

namespace autoshard {

namespace {

const char* kUsage =
    "usage: autoshard plan GRAPH.json[.gz] --mesh 8x8 [--dim-names dp,tp] [--hardware H100]\n"
    "                      [--param-memory LOW,HIGH | --no-param-memory] [--memory-limit BYTES]\n"
    "                      [--time-limit SECONDS] [--out PLAN.json] [--verbose]\n"
    "  --mesh          mesh shape, sizes joined by 'x' (e.g. 64 or 8x8)\n"
    "  --param-memory  parameter memory per GPU as fractions of the total (default 0,1/mesh size)\n"
    "  --out           write the plan JSON there (the report is printed either way)\n";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, sep);) out.push_back(p);
  return out;
}

double parse_double(const std::string& s, const std::string& what) {
  size_t pos = 0;
  double v = 0;
  try { v = std::stod(s, &pos); } catch (const std::exception&) { pos = 0; }
  if (pos == 0 || pos != s.size()) throw std::invalid_argument(what + ": '" + s + "' is not a number");
  return v;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string graph_path, out_path;
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
      for (const auto& p : split(value(i), 'x')) o.mesh.shape.push_back(static_cast<int64_t>(parse_double(p, "--mesh")));
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
    } else if (a == "--no-param-memory") {
      o.parameter_memory_default = false;
      o.parameter_memory.reset();
    } else if (a == "--memory-limit") {
      o.memory_limit_bytes = static_cast<int64_t>(parse_double(value(i), "--memory-limit"));
    } else if (a == "--time-limit") {
      o.time_limit_s = parse_double(value(i), "--time-limit");
    } else if (a == "--out") {
      out_path = value(i);
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
  Graph graph = read_graph_file(graph_path);
  Json plan = plan_graph(graph, o);
  out << plan.at("report").as_string();
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    if (!f) throw std::runtime_error("cannot write '" + out_path + "'");
    f << plan.dump(1) << "\n";
    out << "plan written to " << out_path << "\n";
  }
  return 0;
}

}  // namespace autoshard
