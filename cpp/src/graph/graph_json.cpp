// Reader of the tensor graph JSON (docs/formats.md section 1). Every error names the node and
// the field that is wrong, because the file comes from a tracer and a user must be able to
// find the offending node in their model.
#include <string>

#include "autoshard/graph.h"
#include "strategies_json.h"

namespace autoshard {

namespace {

std::string node_where(const std::string& name, const std::string& op) {
  return "graph node '" + name + "'" + (op.empty() ? std::string() : " (" + op + ")");
}

// Objects standing for torch enums in arguments: {"dtype": ...}, {"device": ...}, ...
bool parse_enum_object(const Json& v, ArgValue& out) {
  if (v.size() != 1) return false;
  const auto& [key, val] = v.items().front();
  if (!val.is_string()) return false;
  if (key == "dtype") { out.kind = ArgValue::Kind::DType; out.s = val.as_string(); return true; }
  if (key == "device") { out.kind = ArgValue::Kind::Device; out.s = val.as_string(); return true; }
  if (key == "layout" || key == "memory_format") {
    out.kind = ArgValue::Kind::Enum;
    out.s = key + ":" + val.as_string();
    return true;
  }
  return false;
}

class GraphReader {
 public:
  Graph read(const Json& doc) {
    if (!doc.is_object()) throw JsonError("graph: expected a JSON object at the top level");
    const Json* version = doc.find("version");
    if (!version) throw JsonError("graph: missing field \"version\" (expected 1)");
    if (version->as_int("graph.version") != 1)
      throw JsonError("graph.version: unsupported version " + std::to_string(version->as_int()) +
                      " (this autoshard reads version 1; re-trace the model with a matching autoshard)");
    const auto& nodes = doc.at("nodes", "graph").as_array("graph.nodes");
    g_.nodes.reserve(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) read_node(nodes[i], i);
    const Json* outs = doc.find("outputs");
    if (!outs) throw JsonError("graph: missing field \"outputs\"");
    const auto& list = outs->as_array("graph.outputs");
    for (size_t i = 0; i < list.size(); ++i) read_output(list[i], i);
    return std::move(g_);
  }

 private:
  Graph g_;

  void read_node(const Json& j, size_t index) {
    std::string at = "graph.nodes[" + std::to_string(index) + "]";
    if (!j.is_object()) throw JsonError(at + ": expected an object");
    Node n;
    n.name = j.at("name", at).as_string(at + ".name");
    at = node_where(n.name, "");
    n.op = j.at("op", at).as_string(at + ": field 'op'");
    at = node_where(n.name, n.op);
    if (g_.index_by_name.count(n.name)) throw JsonError(at + ": duplicate node name");

    if (n.op == "placeholder") {
      const std::string& role = j.at("role", at).as_string(at + ": field 'role'");
      if (role == "parameter" || role == "buffer") {
        n.role = role == "parameter" ? NodeRole::Parameter : NodeRole::Buffer;
        n.fqn = j.at("fqn", at).as_string(at + ": field 'fqn'");
      } else if (role == "input") {
        n.role = NodeRole::Input;
        n.input_index = static_cast<int>(j.at("input_index", at).as_int(at + ": field 'input_index'"));
      } else if (role == "tangent") {
        n.role = NodeRole::Tangent;
        n.tangent_of = static_cast<int>(j.at("tangent_of", at).as_int(at + ": field 'tangent_of'"));
      } else {
        throw JsonError(at + ": field 'role': unknown role '" + role +
                        "' (expected parameter, buffer, input or tangent)");
      }
    } else {
      n.role = NodeRole::Compute;
      if (const Json* ph = j.find("phase"); ph && !ph->is_null()) {
        const std::string& p = ph->as_string(at + ": field 'phase'");
        if (p == "forward") n.phase = Phase::Forward;
        else if (p == "backward") n.phase = Phase::Backward;
        else throw JsonError(at + ": field 'phase': expected \"forward\" or \"backward\", found \"" + p + "\"");
      }
      if (const Json* args = j.find("args"); args && !args->is_null()) {
        const auto& list = args->as_array(at + ": field 'args'");
        for (size_t k = 0; k < list.size(); ++k)
          n.args.push_back(read_arg(list[k], at, "args[" + std::to_string(k) + "]"));
      }
      if (const Json* kw = j.find("kwargs"); kw && !kw->is_null()) {
        for (const auto& [key, val] : kw->items(at + ": field 'kwargs'"))
          n.kwargs.emplace_back(key, read_arg(val, at, "kwargs." + key));
      }
    }

    const auto& outs = j.at("outputs", at).as_array(at + ": field 'outputs'");
    for (size_t k = 0; k < outs.size(); ++k) {
      std::string f = at + ": field 'outputs[" + std::to_string(k) + "]'";
      if (outs[k].is_null()) { n.outputs.emplace_back(std::nullopt); continue; }
      if (!outs[k].is_object()) throw JsonError(f + ": expected {\"shape\": [...], \"dtype\": ...} or null");
      TensorMeta m;
      for (const auto& d : outs[k].at("shape", f).as_array(f + ".shape")) {
        int64_t s = d.as_int(f + ".shape");
        if (s < 0) throw JsonError(f + ".shape: negative size " + std::to_string(s));
        m.shape.push_back(s);
      }
      const std::string& dt = outs[k].at("dtype", f).as_string(f + ".dtype");
      try {
        m.dtype = parse_dtype(dt);
      } catch (const std::exception& e) {
        throw JsonError(f + ".dtype: " + e.what());
      }
      // Sizes in bytes are int64 and get summed over many tensors; a size past 2^53 bytes (a
      // mistyped shape) would overflow those sums into negative memory instead of an error.
      long double bytes = dtype_bytes(m.dtype);
      for (int64_t s : m.shape) bytes *= s;
      if (bytes > 9007199254740992.0L)
        throw JsonError(f + ".shape: a tensor of this shape would take more than 2^53 bytes; check the shape");
      n.outputs.emplace_back(std::move(m));
    }
    if (n.op == "placeholder" && (n.outputs.size() != 1 || !n.outputs[0]))
      throw JsonError(at + ": field 'outputs': a placeholder has exactly one tensor output");

    if (const Json* s = j.find("source"); s && !s->is_null()) n.source = s->as_string(at + ": field 'source'");
    if (const Json* m = j.find("module"); m && !m->is_null()) n.module = m->as_string(at + ": field 'module'");
    if (const Json* li = j.find("local_inputs"); li && !li->is_null()) {
      const size_t num_refs = n.tensor_inputs().size();
      for (const Json& k : li->as_array(at + ": field 'local_inputs'")) {
        const int64_t pos = k.as_int(at + ": field 'local_inputs'");
        if (pos < 0 || pos >= static_cast<int64_t>(num_refs))
          throw JsonError(at + ": field 'local_inputs': position " + std::to_string(pos) + " but the node has " +
                          std::to_string(num_refs) + " tensor input(s)");
        n.local_inputs.push_back(static_cast<int32_t>(pos));
      }
    }
    if (const Json* st = j.find("strategies"); st && !st->is_null()) {
      if (n.op == "placeholder") throw JsonError(at + ": field 'strategies': a placeholder takes no strategies");
      n.strategies = read_explicit_strategies(*st, g_, n, at);
    }
    g_.index_by_name.emplace(n.name, static_cast<int32_t>(g_.nodes.size()));
    g_.nodes.push_back(std::move(n));
  }

  TensorRef resolve_ref(const Json& j, const std::string& at, const std::string& field) {
    std::string f = at + ": field '" + field + "'";
    const std::string& name = j.at("ref", f).as_string(f + ".ref");
    auto it = g_.index_by_name.find(name);
    if (it == g_.index_by_name.end())
      throw JsonError(f + ": reference to unknown node '" + name +
                      "' (nodes must appear before their users, in topological order)");
    TensorRef r;
    r.node = it->second;
    int64_t idx = 0;
    if (const Json* k = j.find("index"); k && !k->is_null()) idx = k->as_int(f + ".index");
    const Node& producer = g_.nodes[r.node];
    if (idx < 0 || idx >= static_cast<int64_t>(producer.outputs.size()))
      throw JsonError(f + ": output index " + std::to_string(idx) + " out of range: node '" + name + "' has " +
                      std::to_string(producer.outputs.size()) + " output(s)");
    if (!producer.outputs[idx])
      throw JsonError(f + ": output " + std::to_string(idx) + " of node '" + name + "' is None");
    r.output = static_cast<int32_t>(idx);
    return r;
  }

  ArgValue read_arg(const Json& j, const std::string& at, const std::string& field) {
    ArgValue v;
    switch (j.kind()) {
      case Json::Kind::Null: v.kind = ArgValue::Kind::None; break;
      case Json::Kind::Bool: v.kind = ArgValue::Kind::Bool; v.b = j.as_bool(); break;
      case Json::Kind::Number:
        if (j.is_integer()) { v.kind = ArgValue::Kind::Int; v.i = j.as_int(); v.f = static_cast<double>(v.i); }
        else { v.kind = ArgValue::Kind::Float; v.f = j.as_double(); }
        break;
      case Json::Kind::String: v.kind = ArgValue::Kind::String; v.s = j.as_string(); break;
      case Json::Kind::Array: {
        v.kind = ArgValue::Kind::List;
        const auto& items = j.as_array();
        for (size_t k = 0; k < items.size(); ++k)
          v.list.push_back(read_arg(items[k], at, field + "[" + std::to_string(k) + "]"));
        break;
      }
      case Json::Kind::Object:
        if (j.contains("ref")) {
          v.kind = ArgValue::Kind::Tensor;
          v.tensor = resolve_ref(j, at, field);
        } else if (!parse_enum_object(j, v)) {
          throw JsonError(at + ": field '" + field +
                          "': unknown argument object (expected {\"ref\": ...}, {\"dtype\": ...}, "
                          "{\"device\": ...}, {\"layout\": ...} or {\"memory_format\": ...})");
        }
        break;
    }
    return v;
  }

  void read_output(const Json& j, size_t index) {
    std::string at = "graph.outputs[" + std::to_string(index) + "]";
    if (!j.is_object()) throw JsonError(at + ": expected an object");
    GraphOutput o;
    o.ref = resolve_ref(j, at, "ref");
    const std::string& role = j.at("role", at).as_string(at + ".role");
    if (role == "output") {
      o.role = GraphOutput::Role::Output;
      o.output_index = static_cast<int>(j.at("output_index", at).as_int(at + ".output_index"));
    } else if (role == "grad") {
      o.role = GraphOutput::Role::Grad;
      const std::string& of = j.at("grad_of", at).as_string(at + ".grad_of");
      auto it = g_.index_by_name.find(of);
      if (it == g_.index_by_name.end() || g_.nodes[it->second].op != "placeholder")
        throw JsonError(at + ".grad_of: '" + of + "' is not a placeholder of the graph");
      o.grad_of = it->second;
      const TensorMeta& gm = *g_.nodes[o.ref.node].outputs[o.ref.output];
      const TensorMeta& pm = *g_.nodes[o.grad_of].outputs[0];
      if (gm.shape != pm.shape)
        throw JsonError(at + ": gradient of '" + of + "' has a different shape than '" + of + "'");
    } else {
      throw JsonError(at + ".role: unknown role '" + role + "' (expected output or grad)");
    }
    g_.outputs.push_back(o);
  }
};

void collect_tensor_refs(const ArgValue& v, std::vector<TensorRef>& out) {
  if (v.kind == ArgValue::Kind::Tensor) out.push_back(v.tensor);
  else if (v.kind == ArgValue::Kind::List)
    for (const auto& e : v.list) collect_tensor_refs(e, out);
}

}  // namespace

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}
int64_t TensorMeta::bytes() const { return numel() * dtype_bytes(dtype); }

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

Graph parse_graph(const Json& doc) { return GraphReader().read(doc); }

Graph read_graph_file(const std::string& path) {
  std::string text = read_file_maybe_gzip(path);
  try {
    return parse_graph(parse_json(text));
  } catch (const JsonError& e) {
    throw JsonError(path + ": " + e.what());
  }
}

}  // namespace autoshard
