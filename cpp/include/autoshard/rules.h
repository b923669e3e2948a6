// Op sharding rules. A rule describes, for ONE mesh dim, the ways an op can run sharded: rows
// of (output placements, input placements). The strategy enumerator expands rows to the full
// mesh by Cartesian product over mesh dims (as DTensor's single-dim strategies do), adds the
// all-Replicate row, and drops layouts that are not shardable (a tensor dim smaller than the
// product of the mesh dims sharding it) or that mix Partial kinds. Rules live in
// cpp/src/rules/, one file per op family, and register themselves through RuleRegistrar.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autoshard/graph.h"
#include "autoshard/placement.h"

namespace autoshard {

// ShardingRow (one single-mesh-dim strategy row) is defined in graph.h: nodes carry them too.

// What a rule sees: the node, the graph (for argument metadata) and convenient metadata.
struct RuleContext {
  const Graph& graph;
  const Node& node;
  std::vector<TensorMeta> inputs;                  // metas of node.tensor_inputs(), in order
  std::vector<std::optional<TensorMeta>> outputs;  // node.outputs
  const Mesh& mesh;
};

struct OpRule {
  // Single-mesh-dim rows, excluding the all-Replicate row (always added).
  std::function<std::vector<ShardingRow>(const RuleContext&)> rows;
  // Optional full-mesh check of an expanded strategy (e.g. a view that can only keep a
  // sharding when the local size divides evenly); return false to drop it.
  std::function<bool(const RuleContext&, const std::vector<Layout>& outputs, const std::vector<Layout>& inputs)> accept;
  // FLOPs of the op given LOCAL input/output metas (0 = memory-bound).
  std::function<double(const RuleContext&, const std::vector<TensorMeta>& local_inputs,
                       const std::vector<TensorMeta>& local_outputs)>
      flops;
  // View-like ops move no data (no compute cost).
  bool is_view = false;
};

class RuleRegistry {
 public:
  static RuleRegistry& instance();
  void add(const std::string& op, OpRule rule);
  const OpRule* find(const std::string& op) const;  // nullptr when the op has no rule
  std::vector<std::string> ops() const;
};

// Static registration helper: `static RuleRegistrar r("aten.mm.default", rule);`.
// Note: rule files are linked through a static library, so registration must be forced; each
// rule file defines `void register_<family>_rules()` and cpp/src/rules/all_rules.cpp calls them.
struct RuleRegistrar {
  RuleRegistrar(const std::string& op, OpRule rule) { RuleRegistry::instance().add(op, std::move(rule)); }
};
void register_all_rules();  // idempotent; called by the strategy enumerator

}  // namespace autoshard
