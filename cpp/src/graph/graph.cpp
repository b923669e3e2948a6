// Graph IR helpers that need no file format: sizes of tensor metadata, a node's tensor
// inputs in plan order, lookups.
#include <stdexcept>
#include <string>

#include "autoshard/graph.h"

namespace autoshard {

namespace {

void collect_tensor_refs(const ArgValue& v, std::vector<TensorRef>& out) {
  if (v.kind == ArgValue::Kind::Tensor)
    out.push_back(v.tensor);
  else if (v.kind == ArgValue::Kind::List)
    for (const auto& e : v.list) collect_tensor_refs(e, out);
}

}  // namespace

std::vector<TensorRef> Node::tensor_inputs() const {
  std::vector<TensorRef> refs;
  for (const auto& a : args) collect_tensor_refs(a, refs);
  for (const auto& [k, a] : kwargs) collect_tensor_refs(a, refs);
  return refs;
}

const ArgValue* Node::kwarg(const std::string& key) const {
  for (const auto& [k, v] : kwargs)
    if (k == key) return &v;
  return nullptr;
}

const TensorMeta& Graph::meta(const TensorRef& r) const {
  if (r.node < 0 || r.node >= static_cast<int32_t>(nodes.size()))
    throw std::out_of_range("tensor reference to node #" + std::to_string(r.node) + " outside the graph");
  const Node& n = nodes[r.node];
  if (r.output < 0 || r.output >= static_cast<int32_t>(n.outputs.size()) || !n.outputs[r.output])
    throw std::out_of_range("node '" + n.name + "' has no tensor output " + std::to_string(r.output));
  return *n.outputs[r.output];
}

}  // namespace autoshard
