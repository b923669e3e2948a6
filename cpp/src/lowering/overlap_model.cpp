// Exposed communication (overlap_model.h): which redistributions run beside compute.
#include "autoshard/overlap_model.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>
#include <string>

#include "autoshard/layout.h"
#include "autoshard/lowering.h"

namespace autoshard {

namespace {

// Ops that only move or re-label data: a gradient reduced before one of these still feeds
// nothing but the gradient outputs, so no backward compute waits for it.
bool moves_data_only(const Node& node, const std::vector<Strategy>& strategies) {
  static const std::set<std::string> kMovement = {
      "aten.clone.default",    "aten.split.Tensor",       "aten.split_with_sizes.default",
      "aten._to_copy.default", "aten.contiguous.default", "aten.cat.default"};
  if (kMovement.count(node.op)) return true;
  return !strategies.empty() && strategies.front().aliases_input;
}

// The layout holding the fewest elements per rank (Shard on every mesh dim it can), i.e.
// how a fully sharded plan stores the tensor.
Layout most_sharded(const TensorMeta& meta, const Mesh& mesh) {
  Layout best = replicate_layout(mesh.ndim());
  int64_t best_shards = 1;
  for (const Layout& l : all_unpartial_layouts(meta.shape, mesh)) {
    const int64_t n = num_shards(l, mesh);
    if (n > best_shards) {
      best = l;
      best_shards = n;
    }
  }
  return best;
}

// nll_loss's total weight without class weights: the count of targets not ignored, a
// function of the targets alone. The runtime counts them at the top of the forward and, in a
// training step, waits for that all-reduce only at the end of the backward
// (python/autoshard/fuse_reductions.py, late_loss_scale.py).
bool is_target_count(const Graph& g, const TensorRef& r) {
  const Node& src = g.nodes[static_cast<size_t>(r.node)];
  return r.output == 1 && src.op == "aten.nll_loss_forward.default" && src.tensor_inputs().size() == 2;
}

double pass_factor(double overlap, double compute_us, double comm_us, int blocks) {
  if (!(comm_us > 0) || blocks <= 1 || !(overlap > 0)) return 1.0;
  const double hidden = overlap * std::min(1.0, compute_us / comm_us) * (1.0 - 1.0 / blocks);
  return 1.0 - hidden;
}

}  // namespace

std::string parameter_block(const std::string& fqn) {
  size_t start = 0;
  while (start <= fqn.size()) {
    size_t end = fqn.find('.', start);
    if (end == std::string::npos) end = fqn.size();
    const bool digits = end > start && std::all_of(fqn.begin() + static_cast<std::ptrdiff_t>(start),
                                                   fqn.begin() + static_cast<std::ptrdiff_t>(end),
                                                   [](unsigned char ch) { return std::isdigit(ch) != 0; });
    if (digits && end < fqn.size()) return fqn.substr(0, end);  // a numbered module, not a parameter named "0"
    start = end + 1;
  }
  return "";
}

int count_blocks(const std::vector<std::string>& parameter_fqns) {
  std::set<std::string> groups;
  bool outside = false;
  for (const std::string& fqn : parameter_fqns) {
    const std::string block = parameter_block(fqn);
    if (block.empty())
      outside = true;
    else
      groups.insert(block);
  }
  return static_cast<int>(groups.size()) + (outside ? 1 : 0);
}

double charged_time_us(double us, int collectives, double launch_us, double launch_share, double exposed) {
  if (!(us < kInfeasibleCost)) return us;
  // Only a single collective joins a bucket: the steps of a chained redistribution (one per
  // mesh dim) each wait for the previous one, and the runtime buckets none of them.
  const double shared = collectives == 1 ? launch_us * (1.0 - launch_share) : 0.0;
  return std::max(0.0, us - shared) * exposed;
}

OverlapModel model_overlap(const ShardingModel& sm, RedistributionCache& cache) {
  const Graph& g = *sm.graph;
  const Mesh& mesh = sm.model->mesh;
  const size_t n = g.nodes.size();
  OverlapModel m;
  m.input_factor.resize(n);
  m.input_launch_share.resize(n);
  for (size_t c = 0; c < n; ++c) {
    m.input_factor[c].assign(g.nodes[c].tensor_inputs().size(), 1.0);
    m.input_launch_share[c].assign(g.nodes[c].tensor_inputs().size(), 1.0);
  }
  m.output_factor.assign(g.outputs.size(), 1.0);
  m.output_launch_share.assign(g.outputs.size(), 1.0);
  m.launch_us = sm.model->hw.collective_launch_us;
  if (mesh.size() <= 1) return m;

  // Which values exist before the step needs them, and which only feed gradient outputs.
  std::vector<char> prefetchable(n, 0), feeds_grads_only(n, 0);
  std::vector<std::vector<int32_t>> users(n);
  std::vector<int> grad_uses(n, 0), other_output(n, 0);
  std::vector<std::string> fqns;
  for (size_t c = 0; c < n; ++c) {
    const Node& node = g.nodes[c];
    const std::vector<TensorRef> refs = node.tensor_inputs();
    for (const TensorRef& r : refs) users[r.node].push_back(static_cast<int32_t>(c));
    if (node.role == NodeRole::Parameter || node.role == NodeRole::Buffer) {
      prefetchable[c] = 1;
    } else if (node.role == NodeRole::Compute && !refs.empty()) {
      prefetchable[c] = std::all_of(refs.begin(), refs.end(), [&](const TensorRef& r) { return prefetchable[r.node]; });
    }
    if (node.role == NodeRole::Parameter && !node.outputs.empty() && node.outputs[0]) fqns.push_back(node.fqn);
  }
  for (const GraphOutput& o : g.outputs)
    (o.role == GraphOutput::Role::Grad ? grad_uses : other_output)[o.ref.node] += 1;
  for (size_t k = n; k-- > 0;) {
    const Node& node = g.nodes[k];
    if (node.role != NodeRole::Compute || node.phase != Phase::Backward ||
        !moves_data_only(node, sm.of(static_cast<int32_t>(k))))
      continue;
    if (other_output[k] || (users[k].empty() && grad_uses[k] == 0)) continue;
    feeds_grads_only[k] = std::all_of(users[k].begin(), users[k].end(), [&](int32_t u) { return feeds_grads_only[u]; });
  }
  m.blocks = count_blocks(fqns);
  const double share = fqns.empty() ? 1.0 : std::min(1.0, static_cast<double>(m.blocks) / fqns.size());

  // The reference: compute at the cheapest strategies, communication of a fully sharded plan
  // (bucketed as the runtime buckets it).
  const Layout replicated = replicate_layout(mesh.ndim());
  Layout partial(static_cast<size_t>(mesh.ndim()), Placement::partial());
  auto bucketed_us = [&](const TensorMeta& meta, const Layout& from, const Layout& to) {
    return charged_time_us(cache.time_us(meta, from, to), cache.collectives(meta, from, to), m.launch_us, share, 1.0);
  };
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.role == NodeRole::Compute && !sm.of(static_cast<int32_t>(i)).empty()) {
      double cheapest = std::numeric_limits<double>::infinity();
      for (const Strategy& s : sm.of(static_cast<int32_t>(i))) cheapest = std::min(cheapest, s.compute_us);
      (node.phase == Phase::Backward ? m.backward_compute_us : m.forward_compute_us) += cheapest;
    }
    if (node.role != NodeRole::Parameter || node.outputs.empty() || !node.outputs[0]) continue;
    const TensorMeta& meta = *node.outputs[0];
    const Layout sharded = most_sharded(meta, mesh);
    if (num_shards(sharded, mesh) <= 1) continue;
    const double gather = bucketed_us(meta, sharded, replicated);
    m.forward_comm_us += gather;
    m.backward_comm_us += gather + bucketed_us(meta, partial, sharded);
  }
  const double overlap = sm.model->hw.comm_overlap;
  m.forward_factor = pass_factor(overlap, m.forward_compute_us, m.forward_comm_us, m.blocks);
  m.backward_factor = pass_factor(overlap, m.backward_compute_us, m.backward_comm_us, m.blocks);

  // A training step's scalar loss terms run beside everything else: the count of targets
  // (is_target_count) and the reduction of a scalar module output, the loss, whose wait
  // the runtime defers to the value's first use, after the backward (deferred_tail.py).
  const bool training =
      std::any_of(g.nodes.begin(), g.nodes.end(), [](const Node& x) { return x.phase == Phase::Backward; });
  for (size_t c = 0; c < n; ++c) {
    const Node& node = g.nodes[c];
    const double pass = node.phase == Phase::Backward ? m.backward_factor : m.forward_factor;
    const std::vector<TensorRef> refs = node.tensor_inputs();
    for (size_t a = 0; a < refs.size(); ++a) {
      if (training && is_target_count(g, refs[a])) {
        m.input_factor[c][a] = 0.0;
      } else if (prefetchable[refs[a].node]) {
        m.input_factor[c][a] = pass;
        m.input_launch_share[c][a] = share;
      } else if (feeds_grads_only[c]) {
        m.input_factor[c][a] = m.backward_factor;
        m.input_launch_share[c][a] = share;
      }
    }
  }
  for (size_t j = 0; j < g.outputs.size(); ++j) {
    const GraphOutput& o = g.outputs[j];
    if (o.role == GraphOutput::Role::Grad) {
      m.output_factor[j] = m.backward_factor;
      m.output_launch_share[j] = share;
    } else if (training && g.meta(o.ref).numel() == 1) {
      m.output_factor[j] = 0.0;
    }
  }
  return m;
}

}  // namespace autoshard
