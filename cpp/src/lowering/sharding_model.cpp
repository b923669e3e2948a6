// Applying user constraints (pins) to the enumerated strategies.
#include <stdexcept>

#include "autoshard/layout.h"
#include "autoshard/lowering.h"

namespace autoshard {

namespace {

int first_tensor_output(const Node& n) {
  for (size_t k = 0; k < n.outputs.size(); ++k)
    if (n.outputs[k]) return static_cast<int>(k);
  return -1;
}

void check_layout_fits(const TensorMeta& m, const Layout& l, const Mesh& mesh, const std::string& what) {
  for (const auto& p : l)
    if (p.is_shard() && p.dim >= m.rank())
      throw std::invalid_argument(what + ": layout " + layout_list_str(l) + " shards dim " + std::to_string(p.dim) +
                                  " but the tensor has " + std::to_string(m.rank()) + " dims");
  if (!is_shardable(m.shape, l, mesh))
    throw std::invalid_argument(what + ": layout " + layout_list_str(l) + " is not shardable for a tensor of shape " +
                                shape_str(m.shape) + " (a sharded dim is smaller than the mesh dims that split it)");
  if (has_mixed_partial(l))
    throw std::invalid_argument(what + ": layout " + layout_list_str(l) + " mixes Partial kinds");
}

void pin(ShardingModel& sm, int32_t node, const Layout& layout, const std::string& what) {
  const Node& n = sm.graph->nodes[node];
  if (sm.tied.any() && (sm.tied.of(node) != node || sm.tie_counts()[node] > 1))
    throw std::logic_error("internal error: " + what + " pins node '" + n.name +
                           "' of a tied layer; the planner "
                           "leaves pinned layers untied");
  int k = first_tensor_output(n);
  if (k < 0) throw std::invalid_argument(what + ": node '" + n.name + "' has no tensor output to constrain");
  check_layout_fits(*n.outputs[k], layout, sm.model->mesh, what);
  auto& list = sm.strategies[node];
  std::vector<Strategy> kept;
  std::string available;
  for (auto& s : list) {
    const Layout& l = *s.outputs[k];
    if (l == layout)
      kept.push_back(s);
    else if (available.size() < 400)
      available += (available.empty() ? "" : ", ") + layout_list_str(l);
  }
  if (kept.empty())
    throw std::invalid_argument(what + ": no strategy of node '" + n.name + "' (" + n.op + ") produces layout " +
                                layout_list_str(layout) + "; its possible layouts are: " + available);
  list = std::move(kept);
  sm.pinned[node] = true;
}

}  // namespace

std::vector<int32_t> ShardingModel::tie_counts() const {
  std::vector<int32_t> count(strategies.size(), 0);
  for (size_t i = 0; i < count.size(); ++i) ++count[tied.of(static_cast<int32_t>(i))];
  return count;
}

void untie_layers(ShardingModel& sm) {
  if (!sm.tied.any()) return;
  for (size_t i = 0; i < sm.strategies.size(); ++i) {
    const int32_t r = sm.tied.of(static_cast<int32_t>(i));
    if (r != static_cast<int32_t>(i)) sm.strategies[i] = sm.strategies[r];
  }
  sm.tied = RepeatedLayers{};
}

ShardingModel build_sharding_model(const Graph& graph, const MeshModel& model,
                                   std::vector<std::vector<Strategy>> strategies, const PlacementConstraints& c,
                                   RepeatedLayers tied) {
  if (strategies.size() != graph.nodes.size())
    throw std::invalid_argument("build_sharding_model: one strategy list per graph node is needed");
  if (tied.any() && tied.rep.size() != graph.nodes.size())
    throw std::invalid_argument("build_sharding_model: the tied layers belong to another graph");
  ShardingModel sm;
  sm.graph = &graph;
  sm.model = &model;
  sm.strategies = std::move(strategies);
  sm.tied = std::move(tied);
  sm.pinned.assign(graph.nodes.size(), false);
  for (size_t i = 0; i < graph.nodes.size(); ++i) sm.enumerated.push_back(sm.of(static_cast<int32_t>(i)).size());

  const Mesh& mesh = model.mesh;
  for (const auto& [idx, layout] : c.outputs) {
    bool found = false;
    for (const auto& o : graph.outputs)
      if (o.role == GraphOutput::Role::Output && o.output_index == idx) found = true;
    if (!found)
      throw std::invalid_argument("output constraint " + std::to_string(idx) +
                                  ": the graph has no forward output with that index");
  }
  for (const auto& o : graph.outputs) {
    Layout target = replicate_layout(mesh.ndim());
    if (o.role == GraphOutput::Role::Output) {
      auto it = c.outputs.find(o.output_index);
      if (it != c.outputs.end()) {
        check_layout_fits(graph.meta(o.ref), it->second, mesh, "output constraint " + std::to_string(o.output_index));
        target = it->second;
      }
    }
    sm.output_targets.push_back(target);
  }

  for (const auto& [name, layout] : c.inputs) {
    auto it = graph.index_by_name.find(name);
    if (it == graph.index_by_name.end() || graph.nodes[it->second].op != "placeholder")
      throw std::invalid_argument("input constraint '" + name + "': the graph has no placeholder with that name");
    pin(sm, it->second, layout, "input constraint '" + name + "'");
  }
  for (const auto& [name, layout] : c.nodes) {
    auto it = graph.index_by_name.find(name);
    if (it == graph.index_by_name.end())
      throw std::invalid_argument("node constraint '" + name + "': the graph has no node with that name");
    pin(sm, it->second, layout, "node constraint '" + name + "'");
  }
  // A tangent arrives in the layout its forward output leaves in.
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    if (n.role != NodeRole::Tangent || sm.pinned[i]) continue;
    for (size_t k = 0; k < graph.outputs.size(); ++k) {
      const auto& o = graph.outputs[k];
      if (o.role == GraphOutput::Role::Output && o.output_index == n.tangent_of) {
        if (graph.meta(o.ref).shape != n.outputs[0]->shape)
          throw std::invalid_argument("tangent '" + n.name + "' has a different shape than forward output " +
                                      std::to_string(n.tangent_of));
        pin(sm, static_cast<int32_t>(i), sm.output_targets[k],
            "tangent '" + n.name + "' of output " + std::to_string(n.tangent_of));
      }
    }
  }
  return sm;
}

}  // namespace autoshard
