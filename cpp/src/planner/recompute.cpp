// Recomputation chosen per block to fit the memory limit (recompute.h).
#include "autoshard/recompute.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "autoshard/layout.h"

namespace autoshard {

const char* recompute_level_name(RecomputeLevel level) {
  switch (level) {
    case RecomputeLevel::Reshard:
      return "reshard";
    case RecomputeLevel::Selective:
      return "selective";
    case RecomputeLevel::Full:
      return "full";
    default:
      return "none";
  }
}

RecomputeMode parse_recompute_mode(const std::string& name, const std::string& what) {
  if (name == "auto") return RecomputeMode::Auto;
  if (name == "none") return RecomputeMode::Off;
  if (name == "reshard") return RecomputeMode::Reshard;
  if (name == "selective") return RecomputeMode::Selective;
  if (name == "full") return RecomputeMode::Full;
  throw std::invalid_argument(what + ": unknown recompute mode \"" + name +
                              "\" (expected auto: recompute only what the memory limit needs; none; reshard: every "
                              "block gathers its gathered weights and activations again instead of keeping them; "
                              "selective: "
                              "every block keeps its matmul and attention outputs and recomputes the rest; full: "
                              "every block recomputed from its inputs)");
}

std::vector<std::string> RecomputeDecision::node_names(const Graph& graph) const {
  std::vector<std::string> names;
  for (size_t i = 0; i < recompute.size(); ++i)
    if (recompute[i]) names.push_back(graph.nodes[i].name);
  return names;
}

namespace {

// The block a node belongs to: its module's first numbered prefix ("layers.3" for
// "layers.3.attention"), "" outside numbered modules.
std::string block_of(const Node& n) { return parameter_block(n.module + "."); }

// Selective keeps these outputs: the FLOP-heavy ops (matmuls, convolutions, attention).
bool kept_by_selective(const std::string& op) {
  static const std::array<const char*, 11> heavy = {
      "aten.mm.",          "aten.addmm.",    "aten.bmm.",         "aten.baddbmm.",
      "aten.matmul.",      "aten.linear.",   "aten.convolution.", "scaled_dot_product",
      "flash_attention",   "efficient_attention", "flex_attention"};
  for (const char* h : heavy)
    if (op.find(h) != std::string::npos) return true;
  return false;
}

bool early(const Node& n) { return n.phase == Phase::Backward && pass_of(n) == Phase::Forward; }

// A forward view of a parameter (its transpose for a matmul): where the plan gathers the
// parameter for it, the view holds the gathered copy, which the backward reads through it.
bool views_a_parameter(const Graph& g, const Node& n) {
  static const std::array<const char*, 6> views = {"aten.t.",       "aten.transpose.", "aten.permute.",
                                                   "aten.view.",    "aten._unsafe_view.", "aten.detach."};
  const std::vector<TensorRef> refs = n.tensor_inputs();
  if (refs.empty() || g.nodes[static_cast<size_t>(refs[0].node)].role != NodeRole::Parameter) return false;
  for (const char* v : views)
    if (n.op.rfind(v, 0) == 0) return true;
  return false;
}

// Whether `level` recomputes node `n` (given that the node is in a block at that level).
// `kept`: its value must stay (a graph output reads it, or another block does: the block's
// output is the next block's checkpoint, as activation checkpointing keeps each block's
// input; recomputing it would recompute the blocks before it too).
bool recomputed_at(const Graph& g, const Node& n, RecomputeLevel level, bool kept) {
  if (n.role != NodeRole::Compute || !n.recomputable || level == RecomputeLevel::None) return false;
  if (early(n)) return true;
  if (pass_of(n) != Phase::Forward || kept) return false;
  if (views_a_parameter(g, n)) return true;  // gathered again in the backward: reshard
  if (level == RecomputeLevel::Full) return true;
  return level == RecomputeLevel::Selective && !kept_by_selective(n.op);
}

// Local bytes per GPU of node `c`'s outputs under the plan.
int64_t local_output_bytes(const ShardingModel& sm, const std::vector<int32_t>& choice, size_t c) {
  const Node& node = sm.graph->nodes[c];
  const Strategy& s = sm.of(static_cast<int32_t>(c)).at(choice[c]);
  int64_t bytes = 0;
  for (size_t k = 0; k < node.outputs.size() && k < s.outputs.size(); ++k)
    if (node.outputs[k] && s.outputs[k]) bytes += local_meta(*node.outputs[k], *s.outputs[k], sm.model->mesh).bytes();
  return bytes;
}

// The local bytes of the shard behind activation input `a` of node `c` where the plan gathers
// it (the layout the node reads it in holds more of the tensor per GPU than the layout its
// producer makes it in: an all-gather or a part of one), else 0. Parameters and buffers are
// not activations: an op of a gathered weight makes an activation of the usual size (the
// weight's own gathers are the views Reshard recomputes).
int64_t gathered_shard_bytes(const ShardingModel& sm, const std::vector<int32_t>& choice, size_t c, size_t a) {
  const Graph& g = *sm.graph;
  const TensorRef r = g.nodes[c].tensor_inputs()[a];
  const NodeRole role = g.nodes[static_cast<size_t>(r.node)].role;
  if (role == NodeRole::Parameter || role == NodeRole::Buffer) return 0;
  const std::optional<Layout>& from = sm.of(r.node).at(choice[static_cast<size_t>(r.node)]).outputs[r.output];
  if (!from) return 0;
  const Layout& to = sm.of(static_cast<int32_t>(c)).at(choice[c]).inputs[a];
  const int64_t shard = local_meta(g.meta(r), *from, sm.model->mesh).bytes();
  return local_meta(g.meta(r), to, sm.model->mesh).bytes() > shard ? shard : 0;
}

// Whether Reshard may run node `i` again for its gathered inputs: a forward op of an
// `at_reshard` block, not `kept`, that Selective would recompute too (not a matmul or
// attention: their FLOPs run once).
bool regather_candidate(const Node& node, bool at_reshard, bool kept) {
  return at_reshard && !kept && node.role == NodeRole::Compute && node.recomputable &&
         pass_of(node) == Phase::Forward && node.phase == Phase::Forward && !kept_by_selective(node.op);
}

// Whether the backward reads each flagged node's result, directly or through other flagged
// nodes (`flags`: the levels' own; an early node flagged there runs in the backward).
std::vector<char> read_by_backward(const Graph& g, const std::vector<char>& chain, const std::vector<char>& flags) {
  std::vector<char> needed(g.nodes.size(), 0);
  for (size_t u = g.nodes.size(); u-- > 0;) {
    const Node& user = g.nodes[u];
    const bool in_backward = pass_of(user) == Phase::Backward || (flags[u] && early(user));
    if (!in_backward && !(chain[u] && needed[u])) continue;
    for (const TensorRef& r : user.tensor_inputs())
      if (chain[static_cast<size_t>(r.node)]) needed[static_cast<size_t>(r.node)] = 1;
  }
  return needed;
}

// Reshard's activations: the candidate ops (regather_candidate) that read a gathered
// activation, or another such op's result, and whose result is larger per GPU than the shard
// the gather started from, where the backward reads them: recomputed, the backward keeps the
// shard and gathers it again, as it does a parameter (after the keys are gathered: a rotary
// embedding, GQA's repeat, the transpose into attention's layout). An op whose result is no
// larger (the rank's own rows picked out again, a reduction) is kept: keeping it costs no more
// than keeping the shard, and needs no gather.
std::vector<char> regathered_activations(const ShardingModel& sm, const std::vector<int32_t>& choice,
                                         const std::vector<char>& at_reshard, const std::vector<char>& kept,
                                         const std::vector<char>& flags) {
  const Graph& g = *sm.graph;
  const size_t n = g.nodes.size();
  std::vector<char> chain(n, 0);
  std::vector<int64_t> shard(n, 0);  // per chain node: the largest shard its gathers started from
  for (size_t i = 0; i < n; ++i) {
    if (!regather_candidate(g.nodes[i], at_reshard[i] != 0, kept[i] != 0)) continue;
    const std::vector<TensorRef> refs = g.nodes[i].tensor_inputs();
    for (size_t a = 0; a < refs.size(); ++a) {
      const size_t p = static_cast<size_t>(refs[a].node);
      shard[i] = std::max(shard[i], chain[p] ? shard[p] : gathered_shard_bytes(sm, choice, i, a));
    }
    chain[i] = shard[i] > 0 && local_output_bytes(sm, choice, i) > shard[i];
  }
  const std::vector<char> needed = read_by_backward(g, chain, flags);
  for (size_t i = 0; i < n; ++i) chain[i] = chain[i] && needed[i];
  return chain;
}

// The blocks in forward order (the part outside numbered blocks last, as "").
std::vector<std::string> blocks_in_order(const Graph& g) {
  std::vector<std::string> blocks;
  std::set<std::string> seen;
  bool outside = false;
  for (const Node& n : g.nodes) {
    if (n.role != NodeRole::Compute || pass_of(n) != Phase::Forward || n.phase == Phase::Backward) continue;
    const std::string b = block_of(n);
    if (b.empty())
      outside = true;
    else if (seen.insert(b).second)
      blocks.push_back(b);
  }
  if (outside) blocks.push_back("");
  return blocks;
}

// The time the backward spends on the recomputed forward nodes: their compute and their
// inputs' redistributions again, charged as in the forward (a recomputed early node runs
// once either way: nothing is added for it).
double recompute_us(const ShardingModel& sm, const std::vector<int32_t>& choice, const std::vector<char>& flags,
                    RedistributionCache& cache, const OverlapModel& overlap) {
  const Graph& g = *sm.graph;
  double us = 0;
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    if (!flags[c] || early(g.nodes[c])) continue;
    us += sm.of(static_cast<int32_t>(c)).at(choice[c]).compute_us + input_comm(sm, choice, c, cache, overlap).charged_us;
  }
  return us;
}

}  // namespace

std::vector<char> recompute_flags(const ShardingModel& sm, const std::vector<int32_t>& choice,
                                  const std::vector<BlockRecompute>& blocks) {
  const Graph& g = *sm.graph;
  if (choice.size() != g.nodes.size()) throw std::invalid_argument("recompute_flags: one choice per graph node");
  std::map<std::string, RecomputeLevel> level_of;
  for (const BlockRecompute& b : blocks) level_of[b.block] = b.level;
  std::vector<std::string> block(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) block[i] = block_of(g.nodes[i]);
  std::vector<char> kept(g.nodes.size(), 0);
  for (const GraphOutput& o : g.outputs) kept[static_cast<size_t>(o.ref.node)] = 1;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const TensorRef& r : g.nodes[i].tensor_inputs())
      if (block[static_cast<size_t>(r.node)] != block[i]) kept[static_cast<size_t>(r.node)] = 1;
  std::vector<char> flags(g.nodes.size(), 0);
  std::vector<char> at_reshard(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const auto it = level_of.find(block[i]);
    if (it == level_of.end()) continue;
    flags[i] = recomputed_at(g, g.nodes[i], it->second, kept[i] != 0);
    at_reshard[i] = it->second != RecomputeLevel::None;
  }
  const std::vector<char> chain = regathered_activations(sm, choice, at_reshard, kept, flags);
  for (size_t i = 0; i < g.nodes.size(); ++i) flags[i] = flags[i] || chain[i];
  return flags;
}

RecomputeDecision choose_recompute(const ShardingModel& sm, const std::vector<int32_t>& choice,
                                   const OptimizerConfig& optimizer, RecomputeMode mode, int64_t limit_bytes,
                                   RedistributionCache& cache, const OverlapModel& overlap) {
  // A forward-only graph (inference, a no-grad step) keeps nothing for a backward: there
  // is nothing to recompute, whatever the mode or the limit.
  const bool has_backward = std::any_of(sm.graph->nodes.begin(), sm.graph->nodes.end(),
                                        [](const Node& n) { return pass_of(n) == Phase::Backward; });
  const std::vector<std::string> names = has_backward ? blocks_in_order(*sm.graph) : std::vector<std::string>{};
  auto decide = [&](RecomputeLevel low, RecomputeLevel high, size_t raised) {
    RecomputeDecision d;
    for (size_t b = 0; b < names.size(); ++b) d.blocks.push_back({names[b], b < raised ? high : low});
    d.recompute = recompute_flags(sm, choice, d.blocks);
    d.memory = step_memory(sm, choice, optimizer, d.recompute);
    d.added_us = recompute_us(sm, choice, d.recompute, cache, overlap);
    d.limit_bytes = std::max<int64_t>(0, limit_bytes);
    d.fits = limit_bytes <= 0 || d.memory.total_peak() <= limit_bytes;
    return d;
  };
  const size_t all = names.size();
  if (mode == RecomputeMode::Reshard) return decide(RecomputeLevel::Reshard, RecomputeLevel::Reshard, all);
  if (mode == RecomputeMode::Selective) return decide(RecomputeLevel::Selective, RecomputeLevel::Selective, all);
  if (mode == RecomputeMode::Full) return decide(RecomputeLevel::Full, RecomputeLevel::Full, all);
  RecomputeDecision none = decide(RecomputeLevel::None, RecomputeLevel::None, 0);
  if (mode == RecomputeMode::Off || none.fits) return none;
  RecomputeLevel below = RecomputeLevel::None;
  for (RecomputeLevel level : {RecomputeLevel::Reshard, RecomputeLevel::Selective, RecomputeLevel::Full}) {
    RecomputeDecision every = decide(below, level, all);
    if (every.fits) {
      // The fewest blocks raised to `level` that fit (the peak falls as blocks are raised).
      size_t lo = 1, hi = all;
      RecomputeDecision best = std::move(every);
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        RecomputeDecision d = decide(below, level, mid);
        if (d.fits) {
          best = std::move(d);
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      return best;
    }
    if (level == RecomputeLevel::Full) return every;
    below = level;
  }
  return none;  // not reached
}

}  // namespace autoshard
