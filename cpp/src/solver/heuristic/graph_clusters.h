// Groups of nodes tied by bijective edges: an edge whose finite entries form a one-to-one map
// between the two nodes' strategies (XLA's "follow" / alias constraints, everything else is
// infeasible). Inside a group, one node's strategy fixes all the others', so the search moves
// and decodes a whole group at once instead of hitting infeasible entries one node at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "graph_view.h"

namespace autoshard::detail {

struct Clusters {
  std::vector<int32_t> cluster_of;     // node -> cluster
  std::vector<int32_t> member_offset;  // cluster -> members [offset, offset+1), root first
  std::vector<int32_t> members;
  std::vector<int64_t> map_offset;     // node -> its map at map_offset[node]
  std::vector<int32_t> label_of_root;  // [map_offset[i] + root label] -> label of node i
  std::vector<int32_t> root_of_label;  // [map_offset[i] + label of i] -> root label

  int32_t num_clusters() const { return static_cast<int32_t>(member_offset.size()) - 1; }
  int32_t size(int32_t c) const { return member_offset[c + 1] - member_offset[c]; }
  int32_t root(int32_t c) const { return members[member_offset[c]]; }
};

Clusters find_clusters(const GraphView& g);

}  // namespace autoshard::detail
