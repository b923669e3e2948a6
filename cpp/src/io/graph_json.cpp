// Reader of the tensor graph JSON (docs/formats.md section 1). Every error names the node and
// the field that is wrong, because the file comes from a tracer and a user must be able to
// find the offending node in their model.
#include "io/graph_json.h"

#include <string>

#include "io/read_file.h"
#include "io/strategies_json.h"

namespace autoshard {

namespace {

std::string node_where(const std::string& name, const std::string& op) {
  return "graph node '" + name + "'" + (op.empty() ? std::string() : " (" + op + ")");
}

// Objects standing for torch enums in arguments: {"dtype": ...}, {"device": ...}, ...
bool parse_enum_object(const Json& v, ArgValue& out) {
  if (v.size() != 1) return false;
  const auto& [key, val] = json_items(v).front();
  if (!val.is_string()) return false;
  if (key == "dtype") {
    out.kind = ArgValue::Kind::DType;
    out.s = json_string(val);
    return true;
  }
  if (key == "device") {
    out.kind = ArgValue::Kind::Device;
    out.s = json_string(val);
    return true;
  }
  if (key == "layout" || key == "memory_format") {
    out.kind = ArgValue::Kind::Enum;
    out.s = key + ":" + json_string(val);
    return true;
  }
  return false;
}

class GraphReader {
 public:
  Graph read(const Json& doc) {
    if (!doc.is_object()) throw JsonError("graph: expected a JSON object at the top level");
    const Json* version = json_find(doc, "version");
    if (!version) throw JsonError("graph: missing field \"version\" (expected 1)");
    if (json_int(*version, "graph.version") != 1)
      throw JsonError("graph.version: unsupported version " + std::to_string(json_int(*version)) +
                      " (this autoshard reads version 1; re-trace the model with a matching autoshard)");
    const auto& nodes = json_array(json_at(doc, "nodes", "graph"), "graph.nodes");
    g_.nodes.reserve(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) read_node(nodes[i], i);
    const Json* outs = json_find(doc, "outputs");
    if (!outs) throw JsonError("graph: missing field \"outputs\"");
    const auto& list = json_array(*outs, "graph.outputs");
    for (size_t i = 0; i < list.size(); ++i) read_output(list[i], i);
    return std::move(g_);
  }

 private:
  Graph g_;

  // An optional pass field ("phase", "runs_in"): forward, backward, or absent (Unknown).
  static Phase read_phase(const Json& j, const char* key, const std::string& at) {
    const Json* f = json_find(j, key);
    if (!f || f->is_null()) return Phase::Unknown;
    const std::string where = at + ": field '" + key + "'";
    const std::string& p = json_string(*f, where);
    if (p == "forward") return Phase::Forward;
    if (p == "backward") return Phase::Backward;
    throw JsonError(where + ": expected \"forward\" or \"backward\", found \"" + p + "\"");
  }

  void read_node(const Json& j, size_t index) {
    std::string at = "graph.nodes[" + std::to_string(index) + "]";
    if (!j.is_object()) throw JsonError(at + ": expected an object");
    Node n;
    n.name = json_string(json_at(j, "name", at), at + ".name");
    at = node_where(n.name, "");
    n.op = json_string(json_at(j, "op", at), at + ": field 'op'");
    at = node_where(n.name, n.op);
    if (g_.index_by_name.count(n.name)) throw JsonError(at + ": duplicate node name");

    if (n.op == "placeholder") {
      const std::string& role = json_string(json_at(j, "role", at), at + ": field 'role'");
      if (role == "parameter" || role == "buffer") {
        n.role = role == "parameter" ? NodeRole::Parameter : NodeRole::Buffer;
        n.fqn = json_string(json_at(j, "fqn", at), at + ": field 'fqn'");
      } else if (role == "input") {
        n.role = NodeRole::Input;
        n.input_index = static_cast<int>(json_int(json_at(j, "input_index", at), at + ": field 'input_index'"));
      } else if (role == "tangent") {
        n.role = NodeRole::Tangent;
        n.tangent_of = static_cast<int>(json_int(json_at(j, "tangent_of", at), at + ": field 'tangent_of'"));
      } else {
        throw JsonError(at + ": field 'role': unknown role '" + role +
                        "' (expected parameter, buffer, input or tangent)");
      }
    } else {
      n.role = NodeRole::Compute;
      n.phase = read_phase(j, "phase", at);
      n.runs_in = read_phase(j, "runs_in", at);
      if (const Json* r = json_find(j, "recomputable"); r && !r->is_null())
        n.recomputable = json_bool(*r, at + ": field 'recomputable'");
      if (const Json* args = json_find(j, "args"); args && !args->is_null()) {
        const auto& list = json_array(*args, at + ": field 'args'");
        for (size_t k = 0; k < list.size(); ++k)
          n.args.push_back(read_arg(list[k], at, "args[" + std::to_string(k) + "]"));
      }
      if (const Json* kw = json_find(j, "kwargs"); kw && !kw->is_null()) {
        for (const auto& [key, val] : json_items(*kw, at + ": field 'kwargs'"))
          n.kwargs.emplace_back(key, read_arg(val, at, "kwargs." + key));
      }
    }

    const auto& outs = json_array(json_at(j, "outputs", at), at + ": field 'outputs'");
    for (size_t k = 0; k < outs.size(); ++k) {
      std::string f = at + ": field 'outputs[" + std::to_string(k) + "]'";
      if (outs[k].is_null()) {
        n.outputs.emplace_back(std::nullopt);
        continue;
      }
      if (!outs[k].is_object()) throw JsonError(f + ": expected {\"shape\": [...], \"dtype\": ...} or null");
      TensorMeta m;
      for (const auto& d : json_array(json_at(outs[k], "shape", f), f + ".shape")) {
        int64_t s = json_int(d, f + ".shape");
        if (s < 0) throw JsonError(f + ".shape: negative size " + std::to_string(s));
        m.shape.push_back(s);
      }
      const std::string& dt = json_string(json_at(outs[k], "dtype", f), f + ".dtype");
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

    if (const Json* s = json_find(j, "source"); s && !s->is_null()) n.source = json_string(*s, at + ": field 'source'");
    if (const Json* m = json_find(j, "module"); m && !m->is_null()) n.module = json_string(*m, at + ": field 'module'");
    if (const Json* li = json_find(j, "local_inputs"); li && !li->is_null()) {
      const size_t num_refs = n.tensor_inputs().size();
      for (const Json& k : json_array(*li, at + ": field 'local_inputs'")) {
        const int64_t pos = json_int(k, at + ": field 'local_inputs'");
        if (pos < 0 || pos >= static_cast<int64_t>(num_refs))
          throw JsonError(at + ": field 'local_inputs': position " + std::to_string(pos) + " but the node has " +
                          std::to_string(num_refs) + " tensor input(s)");
        n.local_inputs.push_back(static_cast<int32_t>(pos));
      }
    }
    if (const Json* st = json_find(j, "strategies"); st && !st->is_null()) {
      if (n.op == "placeholder") throw JsonError(at + ": field 'strategies': a placeholder takes no strategies");
      n.strategies = read_explicit_strategies(*st, g_, n, at);
    }
    g_.index_by_name.emplace(n.name, static_cast<int32_t>(g_.nodes.size()));
    g_.nodes.push_back(std::move(n));
  }

  TensorRef resolve_ref(const Json& j, const std::string& at, const std::string& field) {
    std::string f = at + ": field '" + field + "'";
    const std::string& name = json_string(json_at(j, "ref", f), f + ".ref");
    auto it = g_.index_by_name.find(name);
    if (it == g_.index_by_name.end())
      throw JsonError(f + ": reference to unknown node '" + name +
                      "' (nodes must appear before their users, in topological order)");
    TensorRef r;
    r.node = it->second;
    int64_t idx = 0;
    if (const Json* k = json_find(j, "index"); k && !k->is_null()) idx = json_int(*k, f + ".index");
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
    switch (j.type()) {
      case Json::value_t::null:
        v.kind = ArgValue::Kind::None;
        break;
      case Json::value_t::boolean:
        v.kind = ArgValue::Kind::Bool;
        v.b = json_bool(j);
        break;
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
      case Json::value_t::number_float:
        // Integers beyond 64 bits stay floats, as the text cannot be held exactly anyway.
        if (json_is_int64(j)) {
          v.kind = ArgValue::Kind::Int;
          v.i = json_int(j);
          v.f = static_cast<double>(v.i);
        } else {
          v.kind = ArgValue::Kind::Float;
          v.f = json_double(j);
        }
        break;
      case Json::value_t::string:
        v.kind = ArgValue::Kind::String;
        v.s = json_string(j);
        break;
      case Json::value_t::array: {
        v.kind = ArgValue::Kind::List;
        const auto& items = json_array(j);
        for (size_t k = 0; k < items.size(); ++k)
          v.list.push_back(read_arg(items[k], at, field + "[" + std::to_string(k) + "]"));
        break;
      }
      case Json::value_t::object:
        if (json_find(j, "ref")) {
          v.kind = ArgValue::Kind::Tensor;
          v.tensor = resolve_ref(j, at, field);
        } else if (!parse_enum_object(j, v)) {
          throw JsonError(at + ": field '" + field +
                          "': unknown argument object (expected {\"ref\": ...}, {\"dtype\": ...}, "
                          "{\"device\": ...}, {\"layout\": ...} or {\"memory_format\": ...})");
        }
        break;
      default:
        throw JsonError(at + ": field '" + field + "': unsupported JSON value");
    }
    return v;
  }

  void read_output(const Json& j, size_t index) {
    std::string at = "graph.outputs[" + std::to_string(index) + "]";
    if (!j.is_object()) throw JsonError(at + ": expected an object");
    GraphOutput o;
    o.ref = resolve_ref(j, at, "ref");
    const std::string& role = json_string(json_at(j, "role", at), at + ".role");
    if (role == "output") {
      o.role = GraphOutput::Role::Output;
      o.output_index = static_cast<int>(json_int(json_at(j, "output_index", at), at + ".output_index"));
    } else if (role == "grad") {
      o.role = GraphOutput::Role::Grad;
      const std::string& of = json_string(json_at(j, "grad_of", at), at + ".grad_of");
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

}  // namespace

Graph parse_graph(const Json& doc) { return GraphReader().read(doc); }

Graph parse_graph_text(std::string_view text) { return parse_graph(parse_json(text)); }

Graph read_graph_file(const std::string& path) {
  std::string text = read_file_maybe_gzip(path);
  try {
    return parse_graph_text(text);
  } catch (const JsonError& e) {
    throw JsonError(path + ": " + e.what());
  }
}

}  // namespace autoshard
