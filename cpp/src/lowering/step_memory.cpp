// A plan's memory per GPU over one training step (step_memory.h).
#include "autoshard/step_memory.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "autoshard/layout.h"
#include "autoshard/overlap_model.h"
#include "autoshard/redistribute.h"

namespace autoshard {

Phase pass_of(const Node& node) {
  if (node.role == NodeRole::Tangent) return Phase::Backward;
  if (node.role != NodeRole::Compute) return Phase::Forward;
  if (node.runs_in != Phase::Unknown) return node.runs_in;
  return node.phase == Phase::Backward ? Phase::Backward : Phase::Forward;
}

namespace {

// overlap.py's DEFAULT_BUCKET_BYTES (DDP's bucket_cap_mb): the runtime's default reduction and
// gather bucket.
constexpr int64_t kReductionBucketBytes = int64_t{25} << 20;
// overlap.py's SMALL_GROUP_BYTES: a block's gathers under this join the next block's.
constexpr int64_t kSmallGroupBytes = int64_t{1} << 20;

using Storage = std::pair<int32_t, int32_t>;  // (timeline step, output) that owns the bytes

class StepMemoryModel {
 public:
  StepMemoryModel(const ShardingModel& sm, const std::vector<int32_t>& choice, const std::vector<char>& recompute)
      : sm_(sm), g_(*sm.graph), choice_(choice), recompute_(recompute) {}

  StepMemory run(const OptimizerConfig& optimizer) {
    order_timeline();
    find_storages();
    const int64_t steps = static_cast<int64_t>(by_position_.size());
    delta_.assign(static_cast<size_t>(steps) + 1, 0);
    StepMemory m;
    count_persistent(m, optimizer);
    count_outputs(m);
    count_values(m);
    count_collective_buffers(m);
    int64_t live = m.parameters + m.buffers + m.inputs;
    m.step_peak = live;
    for (int64_t t = 0; t < steps; ++t) {
      live += delta_[static_cast<size_t>(t)];
      if (live > m.step_peak) {
        m.step_peak = live;
        const TimelineStep& at = by_position_[static_cast<size_t>(t)];
        m.peak_at = g_.nodes[static_cast<size_t>(at.node)].name + (at.again ? " (recomputed)" : "");
      }
    }
    return m;
  }

 private:
  const ShardingModel& sm_;
  const Graph& g_;
  const std::vector<int32_t>& choice_;
  const std::vector<char>& recompute_;  // per node (or empty): run again in the backward
  struct TimelineStep {
    int32_t node;
    bool again;  // the backward's second run of a recomputed forward node
  };
  std::vector<int64_t> position_;        // graph node -> its (first) step in the timeline
  std::vector<int64_t> again_position_;  // graph node -> the step of its recomputation, or -1
  std::vector<TimelineStep> by_position_;
  int64_t backward_start_ = 0;                 // the backward's first step
  std::vector<std::vector<Storage>> storage_;  // per step's output: the storage it lives in
  std::map<Storage, int64_t> last_read_;       // storage -> the last step that reads it (views included)
  std::set<Storage> leaves_step_;              // storages the step returns as they are (alive to the end)

  const Strategy& strategy(size_t node) const { return sm_.of(static_cast<int32_t>(node)).at(choice_[node]); }
  int64_t local_bytes(const TensorMeta& meta, const Layout& layout) const {
    return local_meta(meta, layout, sm_.model->mesh).bytes();
  }
  int64_t output_bytes(size_t node, size_t k) const {
    const auto& layout = strategy(node).outputs[k];
    return g_.nodes[node].outputs[k] && layout ? local_bytes(*g_.nodes[node].outputs[k], *layout) : 0;
  }
  bool persistent(const Node& n) const {
    return n.role == NodeRole::Parameter || n.role == NodeRole::Buffer || n.role == NodeRole::Input;
  }
  void add_live(int64_t start, int64_t end, int64_t bytes) {
    delta_[static_cast<size_t>(start)] += bytes;
    delta_[static_cast<size_t>(end)] -= bytes;
  }
  std::vector<int64_t> delta_;

  bool recomputed(size_t i) const { return !recompute_.empty() && recompute_[i]; }
  // A recomputed early node (a backward node the forward runs) runs in the backward only.
  Phase pass(size_t i) const {
    const Phase p = pass_of(g_.nodes[i]);
    return recomputed(i) && g_.nodes[i].phase == Phase::Backward ? Phase::Backward : p;
  }
  bool runs_again(size_t i) const { return recomputed(i) && pass(i) == Phase::Forward; }

  void place(size_t i, bool again) {
    (again ? again_position_ : position_)[i] = static_cast<int64_t>(by_position_.size());
    by_position_.push_back({static_cast<int32_t>(i), again});
  }

  // Before backward node `i`: the recomputed forward nodes it reads that have not run
  // again yet, each after its own recomputed inputs (depth first, without recursion).
  void place_recomputed_inputs(size_t i) {
    std::vector<std::pair<size_t, bool>> todo{{i, false}};  // (node, inputs placed)
    while (!todo.empty()) {
      auto [n, ready] = todo.back();
      todo.pop_back();
      if (ready) {
        if (n != i && again_position_[n] < 0) place(n, true);
        continue;
      }
      todo.push_back({n, true});
      const std::vector<TensorRef> refs = g_.nodes[n].tensor_inputs();
      for (auto r = refs.rbegin(); r != refs.rend(); ++r)
        if (runs_again(static_cast<size_t>(r->node)) && again_position_[static_cast<size_t>(r->node)] < 0)
          todo.push_back({static_cast<size_t>(r->node), false});
    }
  }

  // The forward's nodes in graph order, then the backward's, each backward node preceded by
  // the recomputed forward nodes it reads (trace/step_schedule.py backward_order).
  void order_timeline() {
    position_.assign(g_.nodes.size(), 0);
    again_position_.assign(g_.nodes.size(), -1);
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      if (pass(i) == Phase::Forward) place(i, false);
    backward_start_ = static_cast<int64_t>(by_position_.size());
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      if (pass(i) == Phase::Backward) {
        place_recomputed_inputs(i);
        place(i, false);
      }
  }

  // The step whose value a reader at step `t` reads for `ref`: the recomputed copy in the
  // backward, else the node's own.
  int64_t source(const TensorRef& ref, int64_t t) const {
    const int64_t again = again_position_[static_cast<size_t>(ref.node)];
    return again >= 0 && t >= backward_start_ ? again : position_[static_cast<size_t>(ref.node)];
  }
  const Storage& storage_of(const TensorRef& ref, int64_t t) const {
    return storage_[static_cast<size_t>(source(ref, t))][static_cast<size_t>(ref.output)];
  }

  // A view's outputs live in its first input's storage, unless that input arrives through a
  // collective: then they live in the collective's result (a gathered weight's transpose
  // keeps the gathered copy), counted as the view's own. Every other output owns its own.
  bool views_its_input(size_t i, const std::vector<TensorRef>& refs) const {
    if (g_.nodes[i].role != NodeRole::Compute || !strategy(i).aliases_input || refs.empty()) return false;
    return *strategy(refs[0].node).outputs[refs[0].output] == strategy(i).inputs[0];
  }

  void find_storages() {
    storage_.resize(by_position_.size());
    for (size_t t = 0; t < by_position_.size(); ++t) {
      const size_t i = static_cast<size_t>(by_position_[t].node);
      const auto at = static_cast<int64_t>(t);
      const std::vector<TensorRef> refs = g_.nodes[i].tensor_inputs();
      const bool view = views_its_input(i, refs);
      for (size_t k = 0; k < g_.nodes[i].outputs.size(); ++k)
        storage_[t].push_back(view ? storage_of(refs[0], at) : Storage{static_cast<int32_t>(t), static_cast<int32_t>(k)});
      for (const TensorRef& r : refs) {
        int64_t& last = last_read_[storage_of(r, at)];
        last = std::max(last, at);
      }
    }
  }

  void count_persistent(StepMemory& m, const OptimizerConfig& optimizer) {
    std::set<int32_t> has_gradient;
    for (const GraphOutput& o : g_.outputs)
      if (o.role == GraphOutput::Role::Grad) has_gradient.insert(o.grad_of);
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      if (!persistent(n) || !n.outputs[0]) continue;
      const TensorMeta local = local_meta(*n.outputs[0], *strategy(i).outputs[0], sm_.model->mesh);
      const int64_t bytes = local.bytes();
      if (n.role == NodeRole::Buffer) m.buffers += bytes;
      if (n.role == NodeRole::Input) m.inputs += bytes;
      if (n.role != NodeRole::Parameter) continue;
      m.parameters += bytes;
      OptimizerConfig opt = optimizer;
      opt.has_gradients = has_gradient.count(static_cast<int32_t>(i)) > 0;
      const TrainingStateBytes state = training_state_bytes(local.numel(), n.outputs[0]->dtype, opt);
      m.optimizer_state += opt.has_gradients ? state.optimizer_state + state.master_weights : 0;
    }
  }

  // Every computed storage (and tangent) from the step that makes it to its last reader.
  // A storage made in the forward and read in the backward is saved.
  void count_values(StepMemory& m) {
    const auto steps = static_cast<int64_t>(by_position_.size());
    for (int64_t t = 0; t < steps; ++t) {
      const size_t i = static_cast<size_t>(by_position_[static_cast<size_t>(t)].node);
      const Node& n = g_.nodes[i];
      if (persistent(n)) continue;
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const Storage s = storage_[static_cast<size_t>(t)][k];
        if (s != Storage{static_cast<int32_t>(t), static_cast<int32_t>(k)}) continue;  // a view: counted at its storage
        const auto it = last_read_.find(s);
        const int64_t last = std::max(t, it == last_read_.end() ? t : it->second);
        const int64_t end = leaves_step_.count(s) ? steps : last + 1;
        const int64_t bytes = output_bytes(i, k);
        add_live(t, end, bytes);
        if (t < backward_start_ && last >= backward_start_) m.saved_activations += bytes;
      }
    }
  }

  // Gradients and module outputs leave the step: alive from where they are made to the end,
  // in the layout they leave in. A gradient that must be reduced into its parameter's layout
  // waits for its bucket (reduction_buckets), then the reduced copy lives to the end.
  void count_outputs(StepMemory& m) {
    const auto steps = static_cast<int64_t>(by_position_.size());
    std::vector<Reduction> reductions;
    for (size_t j = 0; j < g_.outputs.size(); ++j) {
      const GraphOutput& o = g_.outputs[j];
      const Layout& from = *strategy(o.ref.node).outputs[o.ref.output];
      const Layout& to =
          o.role == GraphOutput::Role::Output ? sm_.output_targets[j] : *strategy(o.grad_of).outputs[0];
      const int64_t bytes = local_bytes(g_.meta(o.ref), to);
      if (o.role == GraphOutput::Role::Grad) m.gradients += bytes;
      const Storage s = storage_[static_cast<size_t>(position_[o.ref.node])][static_cast<size_t>(o.ref.output)];
      if (from == to) {
        leaves_step_.insert(s);  // the value itself leaves the step (nothing new if persistent)
      } else if (o.role == GraphOutput::Role::Grad && !calls_collective(g_.meta(o.ref), from, to)) {
        // A local re-layout (a replicated gradient's own chunk) runs just before the
        // step's output (bucket_reductions moves a reduction's tail there): the whole
        // gradient, e.g. an all-reduced bucket, lives until then.
        int64_t& last = last_read_[s];
        last = std::max(last, steps - 1);
        add_live(steps - 1, steps, bytes);
      } else if (o.role == GraphOutput::Role::Grad) {
        reductions.push_back({position_[o.ref.node], s, local_bytes(g_.meta(o.ref), from), bytes,
                              parameter_block(g_.nodes[o.grad_of].fqn) + "|" + std::string(dtype_name(g_.meta(o.ref).dtype))});
      } else {
        add_live(position_[o.ref.node], steps, bytes);  // the collective's result leaves it
      }
    }
    reduction_buckets(std::move(reductions));
  }

  bool calls_collective(const TensorMeta& global, const Layout& from, const Layout& to) const {
    const Redistribution r = plan_redistribution(global, from, to, *sm_.model);
    return !r.feasible || r.collectives > 0;
  }

  struct Reduction {
    int64_t at;          // where the gradient is made
    Storage unreduced;   // its value before the reduction
    int64_t unreduced_bytes;
    int64_t reduced_bytes;
    std::string key;     // block and dtype: a bucket holds one of each
  };

  // The program reduces gradients in buckets (program/passes/overlap.py bucket_reductions):
  // consecutive gradients of one block and dtype, up to kReductionBucketBytes of them, issued
  // where the last is made, flattened into one buffer. Until then each waits unreduced.
  void reduction_buckets(std::vector<Reduction> reductions) {
    const auto steps = static_cast<int64_t>(by_position_.size());
    std::sort(reductions.begin(), reductions.end(), [](const Reduction& a, const Reduction& b) { return a.at < b.at; });
    size_t first = 0;
    int64_t bucket_bytes = 0;
    auto close = [&](size_t end) {  // the bucket [first, end)
      if (first == end) return;
      const int64_t issue = reductions[end - 1].at;
      int64_t reduced = 0;
      for (size_t k = first; k < end; ++k) {
        int64_t& last = last_read_[reductions[k].unreduced];
        last = std::max(last, issue);
        reduced += reductions[k].reduced_bytes;
      }
      if (end - first > 1) add_live(issue, issue + 1, bucket_bytes);  // the flattened bucket
      add_live(issue, steps, reduced);
      first = end;
      bucket_bytes = 0;
    };
    for (size_t k = 0; k < reductions.size(); ++k) {
      const bool fits = bucket_bytes + reductions[k].unreduced_bytes <= kReductionBucketBytes;
      if (k > first && (reductions[k].key != reductions[first].key || !fits)) close(k);
      bucket_bytes += reductions[k].unreduced_bytes;
    }
    close(reductions.size());
  }

  // A collective's result, in the layout its consumers read: the runtime redistributes a value
  // once per pass and layout, and later readers in the pass read that copy (program/
  // interpreter.py), so it lives from its first reader to its last. A small one both passes
  // read in one layout is kept from the forward for the backward (REUSE_MAX_NUMEL there):
  // saved, not redistributed again. (A recomputed node's inputs are redistributed again: a
  // weight gathered twice.) Parameters gathered in one pass for one block are bucketed
  // (gathered_parameters).
  void count_collective_buffers(StepMemory& m) {
    const std::map<CopyKey, CopyReaders> readers = copy_readers();
    // pass and dtype -> (block, gather) in timeline order
    std::map<std::string, std::vector<std::pair<std::string, Gather>>> gathers;
    std::set<std::pair<CopyKey, bool>> counted;  // (copy, in the backward) already counted
    for_each_redistribution([&](int64_t at, const Strategy& s, size_t a, const TensorRef& ref) {
      const bool backward = at >= backward_start_;
      const bool view = a == 0 && s.aliases_input;  // its result is the view's output, counted there
      const int64_t bytes = local_bytes(g_.meta(ref), s.inputs[a]);
      const Node& from_node = g_.nodes[static_cast<size_t>(ref.node)];
      const CopyKey key{ref.node, ref.output, layout_str(s.inputs[a])};
      const auto found = readers.find(key);
      const bool kept = !view && found != readers.end() && kept_for_backward(key, found->second);
      if (kept && backward) return;  // the forward's copy, counted there
      if (from_node.role == NodeRole::Parameter) {
        const Layout& from = *strategy(ref.node).outputs[ref.output];
        gathers[std::string(backward ? "b|" : "f|") + std::string(dtype_name(g_.meta(ref).dtype))].push_back(
            {parameter_block(from_node.fqn), {at, bytes, local_bytes(g_.meta(ref), from), view}});
        if (kept && counted.insert({key, false}).second) {
          add_live(at + 1, found->second.backward.last + 1, bytes);
          m.saved_activations += bytes;
        }
      } else if (!view && counted.insert({key, backward}).second) {
        const Readers& pass = backward ? found->second.backward : found->second.forward;
        add_live(at, (kept ? found->second.backward.last : pass.last) + 1, bytes);
        if (kept) m.saved_activations += bytes;
      }
    });
    for (auto& [key, in_order] : gathers)
      for (std::vector<Gather>& group : block_groups(std::move(in_order))) gathered_parameters(std::move(group));
  }

  // interpreter.py's REUSE_MAX_NUMEL: the largest value (elements, global) the backward reads
  // from the forward's redistribution instead of redistributing again.
  static constexpr int64_t kReuseMaxNumel = int64_t{1} << 16;

  using CopyKey = std::tuple<int32_t, int32_t, std::string>;  // value (node, output) and layout
  struct Readers {
    int64_t last = -1;  // the step of the last reader
    bool own = false;   // read by a node of this pass that is not a recomputed copy
  };
  struct CopyReaders {
    Readers forward, backward;
  };

  // Every input a compute node reads in another layout than its producer's, in timeline
  // order: fn(step, the consumer's strategy, the input's index, the input).
  template <class Fn>
  void for_each_redistribution(Fn&& fn) const {
    for (size_t t = 0; t < by_position_.size(); ++t) {
      const size_t c = static_cast<size_t>(by_position_[t].node);
      if (g_.nodes[c].role != NodeRole::Compute) continue;
      const Strategy& s = strategy(c);
      const std::vector<TensorRef> refs = g_.nodes[c].tensor_inputs();
      for (size_t a = 0; a < refs.size(); ++a)
        if (*strategy(refs[a].node).outputs[refs[a].output] != s.inputs[a]) fn(static_cast<int64_t>(t), s, a, refs[a]);
    }
  }

  // Every redistributed copy (value and layout) with its readers in each pass (views left
  // out: their result is the view's output).
  std::map<CopyKey, CopyReaders> copy_readers() const {
    std::map<CopyKey, CopyReaders> readers;
    for_each_redistribution([&](int64_t at, const Strategy& s, size_t a, const TensorRef& ref) {
      if (a == 0 && s.aliases_input) return;
      CopyReaders& r = readers[{ref.node, ref.output, layout_str(s.inputs[a])}];
      Readers& pass = at >= backward_start_ ? r.backward : r.forward;
      pass.last = at;
      pass.own = pass.own || !by_position_[static_cast<size_t>(at)].again;
    });
    return readers;
  }

  // interpreter.py _small_redistributions_done_twice: read in one layout by both passes' own
  // nodes, small, and not itself recomputed.
  bool kept_for_backward(const CopyKey& key, const CopyReaders& r) const {
    const auto node = static_cast<size_t>(std::get<0>(key));
    return r.forward.own && r.backward.own && !recomputed(node) &&
           g_.meta(TensorRef{std::get<0>(key), std::get<1>(key)}).numel() <= kReuseMaxNumel;
  }

  // The program gathers a block's parameters in one pass in buckets (program/passes/overlap.py
  // bucket_gathers): consecutive gathers up to kReductionBucketBytes, issued at the bucket's
  // first consumer, the flat result split into a copy per parameter there; each copy lives
  // until its consumer (a view's copy from then on as the view's output). (Gathers
  // prefetched further ahead are bounded by the runtime's prefetch budget, which it takes
  // from the memory the plan leaves under its limit.)
  struct Gather {
    int64_t at;           // the consumer's step
    int64_t bytes;        // the gathered copy
    int64_t local_bytes;  // the parameter's own shard, the gather's input
    bool view;            // the consumer is a view of it (counted as the view's output from `at`)
    bool operator<(const Gather& o) const { return at < o.at; }
  };
  void gathered_parameters(std::vector<Gather> members) {
    std::stable_sort(members.begin(), members.end());
    size_t first = 0;
    int64_t bucket = 0, bucket_input = 0;
    auto close = [&](size_t end) {
      if (first == end) return;
      const int64_t start = members[first].at;
      // The flat input (the shards concatenated) and result, while the result is split and
      // the first consumer runs: the backend may hold both a little past the wait (gloo's
      // worker thread drops them after waking the waiter, NCCL's watchdog when it polls).
      if (end - first > 1) add_live(start, start + 1, bucket + bucket_input);
      for (size_t k = first; k < end; ++k)
        add_live(start, members[k].view ? members[k].at : members[k].at + 1, members[k].bytes);
      first = end;
      bucket = 0;
      bucket_input = 0;
    };
    for (size_t k = 0; k < members.size(); ++k) {
      if (k > first && bucket + members[k].bytes > kReductionBucketBytes) close(k);
      bucket += members[k].bytes;
      bucket_input += members[k].local_bytes;
    }
    close(members.size());
  }

  // The program's gather groups (program/passes/overlap.py bucket_gathers): consecutive
  // gathers of one block, a group under kSmallGroupBytes joined to the next block's (one call
  // instead of two, _join_small), so a small block's weights are gathered with the next
  // block's, where the first of them is read.
  static std::vector<std::vector<Gather>> block_groups(std::vector<std::pair<std::string, Gather>> in_order) {
    std::vector<std::vector<Gather>> groups;
    std::string block;
    int64_t bytes = 0;
    for (size_t k = 0; k < in_order.size(); ++k) {
      const bool next_block = k > 0 && in_order[k].first != block;
      if (k == 0 || (next_block && bytes >= kSmallGroupBytes)) {
        groups.emplace_back();
        bytes = 0;
      }
      block = in_order[k].first;
      bytes += in_order[k].second.bytes;
      groups.back().push_back(in_order[k].second);
    }
    return groups;
  }
};

}  // namespace

StepMemory step_memory(const ShardingModel& sm, const std::vector<int32_t>& choice, const OptimizerConfig& optimizer,
                       const std::vector<char>& recompute) {
  if (choice.size() != sm.graph->nodes.size())
    throw std::invalid_argument("step_memory: one choice per graph node (" + std::to_string(sm.graph->nodes.size()) +
                                "), got " + std::to_string(choice.size()));
  if (!recompute.empty() && recompute.size() != choice.size())
    throw std::invalid_argument("step_memory: one recompute flag per graph node, or none");
  return StepMemoryModel(sm, choice, recompute).run(optimizer);
}

}  // namespace autoshard
