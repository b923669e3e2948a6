// Tensor graph IR: the joint forward+backward ATen graph as traced by the Python front end
// (docs/formats.md section 1). Shapes are global. getitem nodes are already folded away: a
// tensor reference names (producer node, output index).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autoshard/placement.h"
#include "autoshard/tensor.h"

namespace autoshard {

struct TensorRef {
  int32_t node = -1;   // index into Graph::nodes
  int32_t output = 0;  // which output of that node
};

enum class NodeRole { Parameter, Buffer, Input, Tangent, Compute };
enum class Phase { Forward, Backward, Unknown };

// A non-tensor or tensor argument value, kept close to its form in the graph file.
struct ArgValue {
  enum class Kind { None, Int, Float, Bool, String, Tensor, List, DType, Device, Enum };
  Kind kind = Kind::None;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;     // String, DType name, Device, Enum
  TensorRef tensor;  // Tensor
  std::vector<ArgValue> list;

  bool is_tensor() const { return kind == Kind::Tensor; }
  // Convenience accessors that throw a clear error naming `what` on a kind mismatch.
  int64_t as_int(const char* what) const;
  double as_number(const char* what) const;  // Int or Float
  bool as_bool(const char* what) const;
  std::vector<int64_t> as_int_list(const char* what) const;  // List of Int (or a single Int)
};

// One single-mesh-dim strategy row: the placements an op's tensors take on ONE mesh dim.
// `inputs` is aligned with Node::tensor_inputs() (one entry per tensor reference, None tensors
// excluded); `outputs` with Node::outputs (an entry for a None output is ignored). Rules
// (rules.h) return them, and a node may carry its own (Node::strategies).
struct ShardingRow {
  std::vector<Placement> outputs;
  std::vector<Placement> inputs;
};

struct Node {
  std::string name;
  std::string op;  // "placeholder" or e.g. "aten.mm.default"
  NodeRole role = NodeRole::Compute;
  Phase phase = Phase::Unknown;
  // The pass the per-rank program runs it in, where that differs from `phase`: a backward
  // node that reads no gradient (a weight's transpose) runs in the forward and its output is
  // kept for the backward. Unknown: as `phase`.
  Phase runs_in = Phase::Unknown;
  // Whether the backward may run this forward node again instead of keeping its value
  // (recompute.h): false for ops that draw random numbers or write their inputs.
  bool recomputable = true;
  std::string fqn;       // parameters / buffers
  int input_index = -1;  // user inputs
  int tangent_of = -1;   // tangents
  std::vector<ArgValue> args;
  std::vector<std::pair<std::string, ArgValue>> kwargs;
  std::vector<std::optional<TensorMeta>> outputs;  // nullopt for None outputs
  std::string source;                              // user source line, for errors and reports
  std::string module;                              // module path (e.g. "layers.0.attention"), for reports
  // Positions (in tensor_inputs() order) of inputs that must arrive in their producer's
  // layout, with no communication on the way: mixed precision asks for collectives on the
  // other side of a dtype cast (all-gather after the down-cast, reduce after the up-cast).
  std::vector<int32_t> local_inputs;
  // Strategies given with the node instead of a C++ rule: a user's sharding rule
  // (torch's register_sharding) evaluated by the tracer on this node's arguments. When set,
  // they replace the op's rule, expanded to the mesh like a rule's rows (no all-Replicate
  // row added: the user's list is what DTensor runs, so it is taken as it is).
  std::optional<std::vector<ShardingRow>> strategies;

  // Tensor references among args then kwargs, depth-first (the order plan "inputs" use).
  std::vector<TensorRef> tensor_inputs() const;
  const ArgValue* kwarg(const std::string& key) const;
};

struct GraphOutput {
  TensorRef ref;
  enum class Role { Output, Grad } role = Role::Output;
  int output_index = -1;  // Output: position among forward outputs
  int32_t grad_of = -1;   // Grad: node index of the parameter / input placeholder
};

struct Graph {
  std::vector<Node> nodes;  // topological order
  std::vector<GraphOutput> outputs;
  std::unordered_map<std::string, int32_t> index_by_name;

  const TensorMeta& meta(const TensorRef& r) const;  // throws if the output is None
};

// Read from its file format by io/graph_json.h.

}  // namespace autoshard
