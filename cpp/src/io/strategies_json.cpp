// A node's explicit strategies. They come from a user's Python function, so every check a
// rule's rows pass by construction (counts, dims) is made here, with the row and the tensor
// named: the user must see which strategy of their rule is wrong and why.
#include "io/strategies_json.h"

#include <stdexcept>

#include "autoshard/layout.h"
#include "io/layout_json.h"

namespace autoshard {

namespace {

// `where` names the row and the tensor, `meta` is the tensor's (global) metadata.
Placement read_placement(const Json& p, const TensorMeta& meta, const std::string& where) {
  const std::string& text = json_string(p, where);
  Placement out;
  try {
    out = Placement::parse(text);
  } catch (const std::invalid_argument& e) {
    throw JsonError(where + ": " + e.what());
  }
  if (out.is_shard() && out.dim >= meta.rank())
    throw JsonError(where + ": " + text + " shards dim " + std::to_string(out.dim) + " of a tensor with " +
                    std::to_string(meta.rank()) + " dim(s) (shape " + shape_str(meta.shape) + ")");
  return out;
}

std::string count_error(const std::string& field, size_t got, size_t want, const char* what) {
  return field + ": " + std::to_string(got) + " placement(s), but the node has " + std::to_string(want) + " " + what;
}

}  // namespace

std::vector<ShardingRow> read_explicit_strategies(const Json& j, const Graph& g, const Node& n, const std::string& at) {
  const std::string field = at + ": field 'strategies'";
  const auto& list = json_array(j, field);
  if (list.empty())
    throw JsonError(field +
                    ": empty (a node with explicit strategies needs at least one; "
                    "return at least the all-Replicate strategy from the sharding rule)");
  const std::vector<TensorRef> refs = n.tensor_inputs();
  std::vector<ShardingRow> rows;
  for (size_t r = 0; r < list.size(); ++r) {
    // "graph node 'y' (op): field 'strategies[1].inputs[0]'"
    auto fld = [&](const std::string& sub) {
      return at + ": field 'strategies[" + std::to_string(r) + "]" + sub + "'";
    };
    if (!list[r].is_object()) throw JsonError(fld("") + ": expected {\"outputs\": [...], \"inputs\": [...]}");
    const auto& outs = json_array(json_at(list[r], "outputs", fld("")), fld(".outputs"));
    const auto& ins = json_array(json_at(list[r], "inputs", fld("")), fld(".inputs"));
    if (outs.size() != n.outputs.size())
      throw JsonError(count_error(fld(".outputs"), outs.size(), n.outputs.size(), "output(s)"));
    if (ins.size() != refs.size())
      throw JsonError(count_error(fld(".inputs"), ins.size(), refs.size(),
                                  "tensor input(s) (None arguments and non-tensors excluded)"));
    ShardingRow row;
    for (size_t k = 0; k < outs.size(); ++k) {
      const std::string where = fld(".outputs[" + std::to_string(k) + "]");
      if (!n.outputs[k]) {
        if (!outs[k].is_null())
          throw JsonError(where + ": a placement for output " + std::to_string(k) + ", which is None (write null)");
        row.outputs.push_back(Placement::replicate());  // ignored: there is no tensor
        continue;
      }
      if (outs[k].is_null()) throw JsonError(where + ": null, but output " + std::to_string(k) + " is a tensor");
      row.outputs.push_back(read_placement(outs[k], *n.outputs[k], where));
    }
    for (size_t a = 0; a < ins.size(); ++a)
      row.inputs.push_back(read_placement(ins[a], g.meta(refs[a]), fld(".inputs[" + std::to_string(a) + "]")));
    rows.push_back(std::move(row));
  }
  return rows;
}

Json strategy_to_json(const Strategy& s) {
  Json j = Json::object();
  Json inputs = Json::array();
  for (const auto& l : s.inputs) inputs.push_back(layout_to_json(l));
  Json outputs = Json::array();
  for (const auto& o : s.outputs) outputs.push_back(o ? layout_to_json(*o) : Json(nullptr));
  j["inputs"] = std::move(inputs);
  j["outputs"] = std::move(outputs);
  j["compute_us"] = json_number(s.compute_us);
  return j;
}

}  // namespace autoshard
