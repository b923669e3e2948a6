// Identical repeated layers of a graph (a transformer's layers.0 .. layers.N-1), found so that
// the planner can enumerate and price one of them and give every copy the same strategy
// (tied layers): the problem then grows with one layer, not with the depth.
//
// A node belongs to layer k of container C when its module path (compute nodes) or its
// parameter name (placeholders) is "C.k" or starts with "C.k."; the container is the prefix
// with the most such nodes over at least two indices. Layers are compared node by node in
// graph order: the same count, and at each position the same op, role, phase, tensor shapes
// and dtypes (outputs and inputs), non-tensor arguments, local inputs, explicit strategies and
// parameter name below the layer. Only what a node's strategies and costs depend on is
// compared; where a layer's tensors come from (the previous layer, the embedding) is not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autoshard/graph.h"

namespace autoshard {

struct RepeatedLayers {
  std::string container;        // "layers" or "model.layers"; empty: none found
  std::vector<int64_t> tied;    // the tied layers' indices, ascending; tied[0] is the representative
  std::vector<int64_t> untied;  // layers of the container left on their own (they differ)
  size_t nodes_per_layer = 0;
  // Per graph node: the node whose strategy it takes (its position in the representative
  // layer), or itself when it is not tied. Empty when nothing is tied.
  std::vector<int32_t> rep;

  bool any() const { return !rep.empty(); }
  int32_t of(int32_t node) const { return rep.empty() ? node : rep[node]; }
};

// `excluded[i]` (may be empty) marks nodes whose layer must stay untied (e.g. pinned by a
// constraint, so its strategies differ from its copies'). Ties need at least `min_layers`
// identical layers (>= 2).
RepeatedLayers find_repeated_layers(const Graph& graph, const std::vector<bool>& excluded, int min_layers = 2);

}  // namespace autoshard
