// Strategies of graph nodes: for each node, the legal (output layouts, input layouts) choices
// on the full mesh, with their compute cost. Built from the op rules (rules.h) by Cartesian
// product of single-mesh-dim rows; placeholders get every R/S layout.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "autoshard/build_limits.h"
#include "autoshard/graph.h"
#include "autoshard/placement.h"
#include "autoshard/redistribute.h"
#include "autoshard/repeated_layers.h"

namespace autoshard {

struct Strategy {
  std::vector<std::optional<Layout>> outputs;  // one per Node::outputs (nullopt for None outputs)
  std::vector<Layout> inputs;                  // one per Node::tensor_inputs()
  double compute_us = 0;
  // The op is a view: its output is its input's storage (no bytes of its own, no compute).
  // Set from the op's rule here so that later stages need not ask the rule registry.
  bool aliases_input = false;
};

// Raised when an op has no sharding rule: names the op, the node and its source line.
class UnsupportedOpError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Strategies of one node (deduplicated, deterministic order: all-Replicate first for ops).
// With `limits`, the worst case (rows^mesh dims) is reserved against its memory cap before
// enumerating and the clock is checked while enumerating (PlanningLimitError).
std::vector<Strategy> enumerate_node_strategies(const Graph& graph, int32_t node, const MeshModel& model,
                                                BuildLimits* limits = nullptr);
// All nodes; throws UnsupportedOpError listing every op without a rule (not only the first).
// With `tied`, nodes tied to another (copies in repeated layers) get an empty list: they take
// their representative's (ShardingModel::of).
std::vector<std::vector<Strategy>> enumerate_strategies(const Graph& graph, const MeshModel& model,
                                                        BuildLimits* limits = nullptr,
                                                        const RepeatedLayers* tied = nullptr);

// Estimated memory of one strategy of a node with `layouts` tensor layouts on a mesh with
// `mesh_dims` dims (the vectors and their heap blocks), for BuildLimits.
int64_t strategy_bytes(size_t layouts, int mesh_dims);

// "S(0)R -> S(0)S(1) | R" style one-line description for reports.
std::string strategy_str(const Strategy& s);

}  // namespace autoshard
