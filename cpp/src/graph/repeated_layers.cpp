// Finding identical repeated layers (repeated_layers.h).
#include "autoshard/repeated_layers.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

namespace autoshard {

namespace {

// "layers.3.attention.wq" -> ("layers", 3, "attention.wq"): split at the first all-digit
// component; nullopt when there is none.
struct LayerPath {
  std::string container;
  int64_t index = 0;
  std::string below;
};

std::optional<LayerPath> split_layer_path(const std::string& path) {
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('.', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    const bool digits = !part.empty() && part.size() <= 9 &&
                        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && begin > 0) {
      LayerPath lp;
      lp.container = path.substr(0, begin - 1);
      lp.index = std::stoll(part);
      lp.below = end < path.size() ? path.substr(end + 1) : "";
      return lp;
    }
    begin = end + 1;
  }
  return std::nullopt;
}

const std::string& path_of(const Node& n) {
  return (n.role == NodeRole::Parameter || n.role == NodeRole::Buffer) ? n.fqn : n.module;
}

bool same_meta(const TensorMeta& a, const TensorMeta& b) { return a.dtype == b.dtype && a.shape == b.shape; }

// Non-tensor values equal; tensors only by position (their shapes are compared separately).
bool same_arg(const ArgValue& a, const ArgValue& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case ArgValue::Kind::None:
    case ArgValue::Kind::Tensor:
      return true;
    case ArgValue::Kind::Int:
      return a.i == b.i;
    case ArgValue::Kind::Float:
      return a.f == b.f || (a.f != a.f && b.f != b.f);  // NaN equals NaN here
    case ArgValue::Kind::Bool:
      return a.b == b.b;
    case ArgValue::Kind::List:
      if (a.list.size() != b.list.size()) return false;
      for (size_t i = 0; i < a.list.size(); ++i)
        if (!same_arg(a.list[i], b.list[i])) return false;
      return true;
    default:
      return a.s == b.s;
  }
}

bool same_rows(const std::optional<std::vector<ShardingRow>>& a, const std::optional<std::vector<ShardingRow>>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  if (a->size() != b->size()) return false;
  for (size_t i = 0; i < a->size(); ++i)
    if ((*a)[i].outputs != (*b)[i].outputs || (*a)[i].inputs != (*b)[i].inputs) return false;
  return true;
}

// Whether two nodes get the same strategies with the same costs (see the header).
bool same_node(const Graph& g, const Node& a, const Node& b, const std::string& below_a, const std::string& below_b) {
  if (a.op != b.op || a.role != b.role || a.phase != b.phase || below_a != below_b) return false;
  if (a.outputs.size() != b.outputs.size() || a.args.size() != b.args.size() || a.kwargs.size() != b.kwargs.size())
    return false;
  for (size_t k = 0; k < a.outputs.size(); ++k) {
    if (a.outputs[k].has_value() != b.outputs[k].has_value()) return false;
    if (a.outputs[k] && !same_meta(*a.outputs[k], *b.outputs[k])) return false;
  }
  for (size_t i = 0; i < a.args.size(); ++i)
    if (!same_arg(a.args[i], b.args[i])) return false;
  for (size_t i = 0; i < a.kwargs.size(); ++i)
    if (a.kwargs[i].first != b.kwargs[i].first || !same_arg(a.kwargs[i].second, b.kwargs[i].second)) return false;
  const std::vector<TensorRef> ia = a.tensor_inputs(), ib = b.tensor_inputs();
  if (ia.size() != ib.size()) return false;
  for (size_t i = 0; i < ia.size(); ++i)
    if (!same_meta(g.meta(ia[i]), g.meta(ib[i]))) return false;
  return a.local_inputs == b.local_inputs && same_rows(a.strategies, b.strategies);
}

}  // namespace

RepeatedLayers find_repeated_layers(const Graph& g, const std::vector<bool>& excluded, int min_layers) {
  RepeatedLayers out;
  const size_t n = g.nodes.size();
  std::vector<std::optional<LayerPath>> paths(n);
  // container -> (node count, the indices seen)
  std::map<std::string, std::pair<size_t, std::set<int64_t>>> containers;
  for (size_t i = 0; i < n; ++i) {
    paths[i] = split_layer_path(path_of(g.nodes[i]));
    if (!paths[i]) continue;
    auto& c = containers[paths[i]->container];
    ++c.first;
    c.second.insert(paths[i]->index);
  }
  const std::string* best = nullptr;
  size_t best_count = 0;
  for (const auto& [name, c] : containers)  // ordered by name: ties go to the first, on every rank
    if (c.second.size() >= 2 && c.first > best_count) {
      best = &name;
      best_count = c.first;
    }
  if (!best) return out;

  // Compute nodes with no module path (autograd's gradient accumulation, between and inside
  // a layer's backward) join the layer of the next node that has one, when the previous one
  // with a path is a layer too: the same nodes in every layer then get the same position.
  auto in_container = [&](size_t i) { return paths[i] && paths[i]->container == *best; };
  std::vector<size_t> next_with_path(n + 1, n);  // the first node at or after i with a path
  for (size_t i = n; i-- > 0;) next_with_path[i] = path_of(g.nodes[i]).empty() ? next_with_path[i + 1] : i;
  std::optional<size_t> prev;
  for (size_t i = 0; i < n; ++i) {
    if (!path_of(g.nodes[i]).empty()) {
      prev = i;
      continue;
    }
    if (g.nodes[i].role != NodeRole::Compute || !prev || !in_container(*prev)) continue;
    const size_t next = next_with_path[i];
    if (next < n && in_container(next)) paths[i] = LayerPath{*best, paths[next]->index, "(no module)"};
  }

  // Each layer's nodes in graph order; a layer with an excluded node is never tied.
  std::map<int64_t, std::vector<int32_t>> layers;
  std::set<int64_t> blocked;
  for (size_t i = 0; i < n; ++i) {
    if (!paths[i] || paths[i]->container != *best) continue;
    layers[paths[i]->index].push_back(static_cast<int32_t>(i));
    if (i < excluded.size() && excluded[i]) blocked.insert(paths[i]->index);
  }
  auto same_layer = [&](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    if (a.size() != b.size()) return false;
    for (size_t j = 0; j < a.size(); ++j)
      if (!same_node(g, g.nodes[a[j]], g.nodes[b[j]], paths[a[j]]->below, paths[b[j]]->below)) return false;
    return true;
  };
  // Groups of identical layers, each led by its lowest index.
  std::vector<std::vector<int64_t>> groups;
  for (const auto& [index, nodes] : layers) {
    if (blocked.count(index)) continue;
    bool placed = false;
    for (auto& grp : groups)
      if (same_layer(layers.at(grp[0]), nodes)) {
        grp.push_back(index);
        placed = true;
        break;
      }
    if (!placed) groups.push_back({index});
  }
  const std::vector<int64_t>* largest = nullptr;
  for (const auto& grp : groups)
    if (!largest || grp.size() > largest->size()) largest = &grp;
  if (!largest || static_cast<int>(largest->size()) < std::max(2, min_layers)) return out;

  out.container = *best;
  out.tied = *largest;
  for (const auto& [index, nodes] : layers)
    if (!std::binary_search(out.tied.begin(), out.tied.end(), index)) out.untied.push_back(index);
  const std::vector<int32_t>& first = layers.at(out.tied[0]);
  out.nodes_per_layer = first.size();
  out.rep.resize(n);
  for (size_t i = 0; i < n; ++i) out.rep[i] = static_cast<int32_t>(i);
  for (size_t t = 1; t < out.tied.size(); ++t) {
    const std::vector<int32_t>& copy = layers.at(out.tied[t]);
    for (size_t j = 0; j < copy.size(); ++j) out.rep[copy[j]] = first[j];
  }
  return out;
}

}  // namespace autoshard
