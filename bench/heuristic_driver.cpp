// Runs solve_heuristic on one problem file and prints cost, bound, time and peak RSS.
// Usage: heuristic_driver PROBLEM.json[.gz]|PROBLEM.txt TIME_LIMIT_S [best_known]
// (.txt: the plain-text dump written by a conversion script; anything else: read_problem)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "autoshard/heuristic.h"
#include "autoshard/problem.h"
#include "autoshard/evaluate.h"
#if __has_include("autoshard/problem_io.h")
#include "autoshard/problem_io.h"
#define HAVE_PROBLEM_IO 1
#endif

using namespace autoshard;

static Problem read_text(const std::string& path) {
  std::ifstream in(path);
  Problem p;
  size_t n, m;
  in >> n >> m >> p.usage_limit;
  p.node_costs.resize(n);
  p.node_usages.resize(n);
  p.intervals.resize(n);
  for (size_t i = 0; i < n; ++i) {
    size_t k;
    in >> p.intervals[i].start >> p.intervals[i].end >> k;
    p.node_costs[i].resize(k);
    p.node_usages[i].resize(k);
    for (auto& c : p.node_costs[i]) in >> c;
    for (auto& u : p.node_usages[i]) in >> u;
  }
  p.edges.resize(m);
  for (auto& e : p.edges) {
    in >> e.u >> e.v;
    e.costs.resize(p.node_costs[e.u].size() * p.node_costs[e.v].size());
    for (auto& c : e.costs) in >> c;
  }
  return p;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PROBLEM TIME_LIMIT_S [best_known]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const auto t_read = std::chrono::steady_clock::now();
  Problem p;
  if (path.size() > 4 && path.substr(path.size() - 4) == ".txt") {
    p = read_text(path);
  } else {
#ifdef HAVE_PROBLEM_IO
    p = read_problem(path);
#else
    std::fprintf(stderr, "no problem reader built in\n");
    return 2;
#endif
  }
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_read).count();
  // The contest limit covers reading too: the solver gets what is left (less 0.5 s margin).
  SolveOptions o;
  o.time_limit_s = std::max(1.0, std::atof(argv[2]) - read_s - 0.5);
  o.verbose = true;
  SolveResult r = solve_heuristic(p, o);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double best = argc > 3 ? std::atof(argv[3]) : 0;
  if (r.found) {  // independent check of the returned plan
    const Evaluation ev = evaluate(p, r.solution);
    std::printf("evaluate: valid=%d cost=%.0f peak=%lld limit=%lld %s\n", ev.valid, ev.cost, (long long)ev.peak_usage,
                (long long)p.usage_limit, ev.violation.c_str());
  }
  std::printf(
      "%s found=%d cost=%.0f bound=%.0f score=%.4f read=%.1fs solve=%.1fs total=%.1fs first=%.1fs "
      "rss=%.0fMB status=%s\n",
      path.c_str(), r.found, r.cost, r.lower_bound, best > 0 && r.found ? best / r.cost : 0.0, read_s, r.total_time_s,
      read_s + r.total_time_s, r.time_to_first_s, ru.ru_maxrss / 1024.0, r.status.c_str());
  return r.found ? 0 : 1;
}
