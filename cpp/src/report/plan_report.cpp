// The human-readable plan report (logged by the Python side, printed by `autoshard plan`).
#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "autoshard/build_limits.h"
#include "autoshard/layout.h"
#include "autoshard/report.h"

namespace autoshard {

namespace {

std::string fixed(int digits, double v) { return fmt::format("{:.{}f}", v, digits); }
std::string ms(double us) { return fixed(3, us / 1000.0); }
std::string mib(double bytes) { return fixed(2, bytes / (1024.0 * 1024.0)); }

bool is_number(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

struct Group {
  std::string name;
  int nodes = 0;
  double compute_us = 0, comm_us = 0;
  int64_t param_bytes = 0;
  std::vector<std::string> weights;  // "wq.weight S(0)R"
  int32_t main_activation = -1;
  int64_t main_activation_bytes = -1;
};

// The step's memory per GPU against the limit recomputation fitted it to (recompute.h): the
// peak, then what it is made of.
std::string memory_lines(const StepMemory& mem, const RecomputeDecision& rc) {
  const double peak = static_cast<double>(mem.total_peak());
  std::string verdict;
  if (rc.limit_bytes > 0)
    verdict = " of the limit " + human_bytes(static_cast<double>(rc.limit_bytes)) +
              (rc.fits ? " (fits)"
                       : " (DOES NOT FIT even with the recomputation below: use more GPUs, a smaller batch, or a "
                         "larger parameter share per GPU)");
  auto b = [](int64_t v) { return human_bytes(static_cast<double>(v)); };
  return "  memory per GPU: peak " + human_bytes(peak) + verdict + " = step peak " + b(mem.step_peak) +
         (mem.peak_at.empty() ? "" : " (at " + mem.peak_at + ")") + " + optimizer state " + b(mem.optimizer_state) +
         "\n    parameters " + b(mem.parameters) + ", gradients " + b(mem.gradients) + ", saved activations " +
         b(mem.saved_activations) + ", buffers " + b(mem.buffers) + ", inputs " + b(mem.inputs) + "\n";
}

// Which blocks recompute at which level, runs of consecutive blocks at one level joined.
std::string recompute_line(const RecomputeDecision& rc) {
  std::vector<std::string> runs;
  for (size_t b = 0; b < rc.blocks.size();) {
    size_t e = b;
    while (e + 1 < rc.blocks.size() && rc.blocks[e + 1].level == rc.blocks[b].level && !rc.blocks[e + 1].block.empty())
      ++e;
    auto name = [&](size_t k) { return rc.blocks[k].display_name(); };
    if (rc.blocks[b].level != RecomputeLevel::None)
      runs.push_back(name(b) + (e > b ? ".." + name(e) : "") + " " + recompute_level_name(rc.blocks[b].level));
    b = e + 1;
  }
  if (runs.empty()) return "";
  std::string list;
  for (size_t k = 0; k < runs.size(); ++k) list += (k ? ", " : "") + runs[k];
  return "  recompute: " + list + "; +" + fixed(3, rc.added_us / 1000.0) + " ms a step\n";
}

}  // namespace

std::string module_group(const std::string& module) {
  if (module.empty()) return "(other)";
  std::vector<std::string> parts;
  std::stringstream ss(module);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    out += (i ? "." : "") + parts[i];
    if (is_number(parts[i])) return out;
  }
  return parts.front();
}

std::string plan_report(const ShardingModel& sm, const Plan& plan, const bool verbose) {
  const Graph& g = *sm.graph;
  const MeshModel& m = *sm.model;
  std::ostringstream os;
  os << "autoshard plan: mesh " << shape_str(m.mesh.shape) << " (";
  for (size_t i = 0; i < m.mesh.dim_names.size(); ++i) os << (i ? "," : "") << m.mesh.dim_names[i];
  os << ") on " << m.hw.name << ", " << m.mesh.size() << " GPUs\n";
  os << "  estimated step: " << ms(plan.cost.total_us) << " ms = compute " << ms(plan.cost.compute_us)
     << " ms + exposed comm " << ms(plan.cost.exposed_comm_us) << " ms (lower bound " << ms(plan.lower_bound_us)
     << " ms"
     << (plan.proven_optimal
             ? ", optimal"
             : ", gap " +
                   fixed(3, plan.cost.total_us > 0
                                ? 100.0 * std::max(0.0, plan.cost.total_us - plan.lower_bound_us) / plan.cost.total_us
                                : 0.0) +
                   "%")
     << ")\n";
  os << "  communication: " << ms(plan.cost.comm_us) << " ms in all, "
     << ms(plan.cost.comm_us - plan.cost.exposed_comm_us)
     << " ms of it hidden behind compute (prefetched parameter gathers, gradient reductions)\n";
  int64_t total_param = 0;
  for (const auto& n : g.nodes)
    if (n.role == NodeRole::Parameter) total_param += n.outputs[0]->bytes();
  os << "  parameters per GPU: " << mib(static_cast<double>(plan.cost.parameter_bytes_per_gpu)) << " MiB of "
     << mib(static_cast<double>(total_param)) << " MiB"
     << (total_param > 0
             ? " (" +
                   fixed(4, static_cast<double>(plan.cost.parameter_bytes_per_gpu) / static_cast<double>(total_param)) +
                   " of the total)"
             : std::string())
     << "\n";
  os << memory_lines(plan.memory, plan.recompute) << recompute_line(plan.recompute);
  for (const auto& note : plan.notes) os << "  note: " << note << "\n";
  size_t strategies = 0;
  for (const auto& s : sm.strategies) strategies += s.size();
  os << "  graph: " << g.nodes.size() << " nodes, " << strategies
     << " strategies; solver problem: " << plan.solver_nodes << " nodes, " << plan.solver_edges << " edges; solver "
     << plan.solver_status << " in " << fixed(2, plan.solve_time_s) << " s; planning " << fixed(2, plan.total_time_s)
     << " s (strategies " << fixed(2, plan.enumerate_time_s) << " s, problem " << fixed(2, plan.lower_time_s)
     << " s)\n";

  // Per module group, in first-appearance order.
  std::vector<Group> groups;
  std::map<std::string, size_t> index;
  auto group_of = [&](const Node& n) -> Group& {
    std::string name;
    if (n.role == NodeRole::Parameter || n.role == NodeRole::Buffer) {
      std::string owner = n.fqn;
      size_t dot = owner.rfind('.');
      name = module_group(dot == std::string::npos ? owner : owner.substr(0, dot));
    } else if (n.op == "placeholder") {
      name = "(inputs)";
    } else {
      name = module_group(n.module);
    }
    auto [it, fresh] = index.emplace(name, groups.size());
    if (fresh) groups.push_back(Group{name});
    return groups[it->second];
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Strategy& s = sm.of(static_cast<int32_t>(i))[plan.choice[i]];
    Group& grp = group_of(n);
    grp.nodes++;
    grp.compute_us += s.compute_us;
    grp.comm_us += plan.cost.node_comm_us[i];
    if (n.role == NodeRole::Parameter) {
      grp.param_bytes += local_meta(*n.outputs[0], *s.outputs[0], m.mesh).bytes();
      // Named relative to the group ("attention.wq.weight" inside "layers.3").
      std::string w = n.fqn.rfind(grp.name + ".", 0) == 0 ? n.fqn.substr(grp.name.size() + 1) : n.fqn;
      grp.weights.push_back(w + " " + layout_str(*s.outputs[0]));
    } else if (n.role == NodeRole::Compute && n.phase != Phase::Backward && !n.outputs.empty() && n.outputs[0]) {
      int64_t b = n.outputs[0]->bytes();
      if (b >= grp.main_activation_bytes) {
        grp.main_activation_bytes = b;
        grp.main_activation = static_cast<int32_t>(i);
      }
    }
  }
  // Consecutive numbered groups (layers.0, layers.1, ...) with the same placements and costs
  // are printed once: "layers.0-31 (32 identical)".
  auto numbered = [](const std::string& name, std::string& prefix, std::string& number) {
    size_t dot = name.rfind('.');
    if (dot == std::string::npos || !is_number(name.substr(dot + 1))) return false;
    prefix = name.substr(0, dot);
    number = name.substr(dot + 1);
    return true;
  };
  auto signature = [&](const Group& grp) {
    std::string sig = ms(grp.compute_us) + "|" + ms(grp.comm_us) + "|" + std::to_string(grp.param_bytes) + "|";
    for (const auto& w : grp.weights) sig += w + ";";
    if (grp.main_activation >= 0)
      sig += layout_str(*sm.of(grp.main_activation)[plan.choice[grp.main_activation]].outputs[0]);
    return sig;
  };
  os << "\nper module (compute ms | comm ms | params MiB/GPU | weights | main activation):\n";
  for (size_t k = 0; k < groups.size();) {
    const Group& grp = groups[k];
    size_t end = k + 1;
    std::string prefix, first, last;
    if (numbered(grp.name, prefix, first)) {
      std::string sig = signature(grp);
      while (end < groups.size()) {
        std::string p2, n2;
        if (!numbered(groups[end].name, p2, n2) || p2 != prefix || signature(groups[end]) != sig) break;
        last = n2;
        ++end;
      }
    }
    os << "  " << grp.name;
    if (end - k > 1) os << "-" << last << " (" << (end - k) << " identical, each)";
    os << " [" << grp.nodes << " nodes]: " << ms(grp.compute_us) << " | " << ms(grp.comm_us) << " | "
       << mib(static_cast<double>(grp.param_bytes));
    if (!grp.weights.empty()) {
      os << " | ";
      for (size_t w = 0; w < grp.weights.size(); ++w) os << (w ? ", " : "") << grp.weights[w];
    }
    if (grp.main_activation >= 0) {
      const Node& a = g.nodes[grp.main_activation];
      os << " | " << a.name << " " << shape_str(a.outputs[0]->shape) << " "
         << layout_str(*sm.of(grp.main_activation)[plan.choice[grp.main_activation]].outputs[0]);
    }
    os << "\n";
    k = end;
  }

  // Where the communication goes.
  std::vector<size_t> order(g.nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.cost.node_comm_us[a] > plan.cost.node_comm_us[b]; });
  os << "\nlargest communication (node: us, chosen inputs -> outputs):\n";
  for (size_t k = 0; k < std::min<size_t>(10, order.size()) && plan.cost.node_comm_us[order[k]] > 0; ++k) {
    size_t i = order[k];
    os << "  " << g.nodes[i].name << " (" << g.nodes[i].op << "): " << fixed(1, plan.cost.node_comm_us[i]) << " us, "
       << strategy_str(sm.of(static_cast<int32_t>(i))[plan.choice[i]]) << "\n";
  }

  if (verbose) {
    os << "\nper node (strategies, chosen inputs -> outputs, compute us, comm us):\n";
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      const Strategy& s = sm.of(static_cast<int32_t>(i))[plan.choice[i]];
      os << "  " << n.name << " " << n.op << " [" << sm.enumerated[i] << (sm.pinned[i] ? ", pinned" : "") << "] "
         << strategy_str(s) << " " << fixed(2, s.compute_us) << " " << fixed(2, plan.cost.node_comm_us[i]) << "\n";
    }
  }
  return os.str();
}

}  // namespace autoshard
