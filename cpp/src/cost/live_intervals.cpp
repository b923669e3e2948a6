// Live intervals of a graph's tensors in execution order, and the peak of their summed bytes.
#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "autoshard/memory_model.h"

namespace autoshard {
namespace {

// Walks an argument value depth-first and records every tensor reference read at `step`.
void collect_uses(const ArgValue& v, int64_t step, std::vector<std::vector<std::vector<int64_t>>>& uses, const Graph& g,
                  const std::string& consumer) {
  if (v.kind == ArgValue::Kind::Tensor) {
    const TensorRef& r = v.tensor;
    if (r.node < 0 || static_cast<size_t>(r.node) >= g.nodes.size() || r.output < 0 ||
        static_cast<size_t>(r.output) >= g.nodes[static_cast<size_t>(r.node)].outputs.size())
      throw std::invalid_argument("node '" + consumer + "' reads tensor (" + std::to_string(r.node) + ", " +
                                  std::to_string(r.output) + ") which does not exist");
    uses[static_cast<size_t>(r.node)][static_cast<size_t>(r.output)].push_back(step);
  } else if (v.kind == ArgValue::Kind::List) {
    for (const auto& e : v.list) collect_uses(e, step, uses, g, consumer);
  }
}

}  // namespace

LiveInterval live_interval(int64_t def, const std::vector<int64_t>& uses, bool live_to_end, int64_t num_steps) {
  if (num_steps < 0 || def < 0 || def >= std::max<int64_t>(num_steps, 1))
    throw std::invalid_argument("live_interval: definition step " + std::to_string(def) + " is outside [0, " +
                                std::to_string(num_steps) + ")");
  int64_t end = def + 1;
  for (int64_t u : uses) {
    if (u < def || u >= num_steps)
      throw std::invalid_argument("live_interval: use at step " + std::to_string(u) + " of a tensor defined at step " +
                                  std::to_string(def) + " is outside [" + std::to_string(def) + ", " +
                                  std::to_string(num_steps) + ")");
    end = std::max(end, u + 1);
  }
  if (live_to_end) end = std::max(end, num_steps);
  return {def, end};
}

std::vector<std::vector<LiveInterval>> graph_live_intervals(const Graph& g, const LiveIntervalOptions& options) {
  const int64_t n = static_cast<int64_t>(g.nodes.size());
  std::vector<std::vector<std::vector<int64_t>>> uses(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) uses[i].resize(g.nodes[i].outputs.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    for (const auto& a : node.args) collect_uses(a, static_cast<int64_t>(i), uses, g, node.name);
    for (const auto& [key, a] : node.kwargs) collect_uses(a, static_cast<int64_t>(i), uses, g, node.name);
  }
  std::vector<std::vector<bool>> is_output(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) is_output[i].assign(g.nodes[i].outputs.size(), false);
  for (const auto& out : g.outputs) {
    const TensorRef& r = out.ref;
    if (r.node < 0 || r.node >= n || r.output < 0 ||
        static_cast<size_t>(r.output) >= g.nodes[static_cast<size_t>(r.node)].outputs.size())
      throw std::invalid_argument("graph output refers to tensor (" + std::to_string(r.node) + ", " +
                                  std::to_string(r.output) + ") which does not exist");
    is_output[static_cast<size_t>(r.node)][static_cast<size_t>(r.output)] = true;
  }

  std::vector<std::vector<LiveInterval>> result(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    const int64_t def = static_cast<int64_t>(i);
    bool persistent =
        options.persistent_state_whole_step && (node.role == NodeRole::Parameter || node.role == NodeRole::Buffer);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      if (!node.outputs[k]) {
        result[i].push_back({def, def});
        continue;
      }
      for (int64_t u : uses[i][k])
        if (u <= def)
          throw std::invalid_argument("node '" + g.nodes[static_cast<size_t>(u)].name + "' reads output " +
                                      std::to_string(k) + " of '" + node.name +
                                      "' before it is computed (graph not in execution order)");
      if (persistent) {
        result[i].push_back({0, n});
        continue;
      }
      bool to_end = options.outputs_live_to_end && is_output[i][k];
      result[i].push_back(live_interval(def, uses[i][k], to_end, n));
    }
  }
  return result;
}

int64_t peak_live_bytes(const std::vector<LiveInterval>& intervals, const std::vector<int64_t>& bytes) {
  if (intervals.size() != bytes.size())
    throw std::invalid_argument("peak_live_bytes: " + std::to_string(intervals.size()) + " intervals but " +
                                std::to_string(bytes.size()) + " sizes");
  // Sweep: +bytes at start, -bytes at end; ends are processed before starts at the same step
  // because the interval is half-open.
  std::map<int64_t, int64_t> delta;
  for (size_t i = 0; i < intervals.size(); ++i) {
    if (bytes[i] < 0) throw std::invalid_argument("peak_live_bytes: negative size at index " + std::to_string(i));
    if (intervals[i].end < intervals[i].start)
      throw std::invalid_argument("peak_live_bytes: interval " + std::to_string(i) + " ends before it starts");
    if (intervals[i].end == intervals[i].start || bytes[i] == 0) continue;
    delta[intervals[i].start] += bytes[i];
    delta[intervals[i].end] -= bytes[i];
  }
  int64_t live = 0, peak = 0;
  for (const auto& [step, d] : delta) {
    live += d;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace autoshard
