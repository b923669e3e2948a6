// Redistribution plans between layouts (DTensor semantics) and their costs.
#include "autoshard/redistribute.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "autoshard/layout.h"

namespace autoshard {

const char* redist_step_name(RedistStepKind k) {
  switch (k) {
    case RedistStepKind::AllGather:
      return "all-gather";
    case RedistStepKind::ReduceScatter:
      return "reduce-scatter";
    case RedistStepKind::AllReduce:
      return "all-reduce";
    case RedistStepKind::AllToAll:
      return "all-to-all";
    case RedistStepKind::LocalChunk:
      return "local chunk";
    case RedistStepKind::LocalPartition:
      return "local partition";
  }
  return "?";
}

std::string RedistStep::str() const {
  std::ostringstream os;
  os << "mesh dim " << mesh_dim << ": " << from.str() << "->" << to.str() << " " << redist_step_name(kind) << " "
     << static_cast<int64_t>(bytes) << " B " << (comm_us + copy_us) << " us";
  return os.str();
}

namespace {

double numel_of(const std::vector<int64_t>& s) {
  double n = 1;
  for (int64_t v : s) n *= static_cast<double>(v);
  return n;
}

int64_t round_up(int64_t v, int64_t n) { return (v + n - 1) / n * n; }

// A gather / scatter along dim d needs a re-layout unless every dim before d has local size 1.
bool needs_relayout(const std::vector<int64_t>& local, int d) {
  for (int k = 0; k < d; ++k)
    if (local[k] > 1) return true;
  return false;
}

class Planner {
 public:
  Planner(const TensorMeta& g, const Layout& from, const MeshModel& m) : global_(g), cur_(from), m_(m) {}

  Redistribution result;

  // One transition on one mesh dim; updates the current layout.
  void step(int i, const Placement& to) {
    Placement from = cur_[i];
    if (from == to) return;
    int64_t n = m_.mesh.shape[i];
    if (n == 1) {
      cur_[i] = to;
      return;
    }  // a size-1 mesh dim holds the whole tensor either way
    Layout without = cur_;
    without[i] = Placement::replicate();
    std::vector<int64_t> other = max_local_shape(global_.shape, without, m_.mesh);
    double elem = dtype_bytes(global_.dtype);
    const MeshDimLink& link = m_.links[i];
    RedistStep s;
    s.mesh_dim = i;
    s.from = from;
    s.to = to;
    auto padded_bytes = [&](int d) {
      std::vector<int64_t> p = other;
      p[d] = round_up(p[d], n);
      return numel_of(p) * elem;
    };
    auto copy = [&](double bytes) { return memory_time_us(m_.hw, 2 * bytes); };
    if (from.is_shard() && to.is_replicate()) {
      s.kind = RedistStepKind::AllGather;
      s.bytes = padded_bytes(from.dim);
      s.comm_us = collective_time_us(Collective::AllGather, s.bytes, link);
      if (needs_relayout(other, from.dim)) s.copy_us = copy(s.bytes);
    } else if (from.is_partial() && to.is_replicate()) {
      s.kind = RedistStepKind::AllReduce;
      s.bytes = numel_of(other) * elem;
      s.comm_us = collective_time_us(Collective::AllReduce, s.bytes, link);
    } else if (from.is_partial() && to.is_shard()) {
      s.kind = RedistStepKind::ReduceScatter;
      s.bytes = padded_bytes(to.dim);
      s.comm_us = collective_time_us(Collective::ReduceScatter, s.bytes, link);
      if (needs_relayout(other, to.dim)) s.copy_us = copy(s.bytes);
    } else if (from.is_shard() && to.is_shard()) {
      s.kind = RedistStepKind::AllToAll;
      std::vector<int64_t> p = other;
      p[from.dim] = round_up(p[from.dim], n);
      p[to.dim] = round_up(p[to.dim], n);
      s.bytes = numel_of(p) * elem / static_cast<double>(n);  // the per-rank buffer
      s.comm_us = collective_time_us(Collective::AllToAll, s.bytes, link);
      int relayouts = (needs_relayout(other, from.dim) ? 1 : 0) + (needs_relayout(other, to.dim) ? 1 : 0);
      s.copy_us = relayouts * copy(s.bytes);
    } else if (from.is_replicate() && to.is_shard()) {
      s.kind = RedistStepKind::LocalChunk;
    } else if (from.is_replicate() && to.is_partial()) {
      s.kind = RedistStepKind::LocalPartition;
      // Sum partitions by dividing the value by the group size (one pass over the local data).
      if (to.reduce == ReduceOp::Sum) s.copy_us = copy(numel_of(other) * elem);
    } else if (from.is_shard() && to.is_partial()) {
      fail("Shard -> Partial on mesh dim " + std::to_string(i) + " is not a planned redistribution");
      return;
    } else {
      fail(from.str() + " -> " + to.str() + " on mesh dim " + std::to_string(i) +
           ": converting between Partial reduce ops is not supported");
      return;
    }
    result.time_us += s.comm_us + s.copy_us;
    if (s.comm_us > 0) ++result.collectives;
    result.steps.push_back(s);
    cur_[i] = to;
  }

  const Layout& current() const { return cur_; }
  bool ok() const { return result.feasible; }

 private:
  void fail(const std::string& why) {
    result.feasible = false;
    result.reason = why;
    result.time_us = std::numeric_limits<double>::infinity();
  }
  const TensorMeta& global_;
  Layout cur_;
  const MeshModel& m_;
};

}  // namespace

Redistribution plan_redistribution(const TensorMeta& global, const Layout& from, const Layout& to,
                                   const MeshModel& model) {
  const Mesh& mesh = model.mesh;
  if (static_cast<int>(from.size()) != mesh.ndim() || static_cast<int>(to.size()) != mesh.ndim())
    throw std::invalid_argument("redistribution " + layout_list_str(from) + " -> " + layout_list_str(to) +
                                ": layouts must have one placement per mesh dim (" + std::to_string(mesh.ndim()) + ")");
  Planner p(global, from, model);
  const int nd = mesh.ndim();
  bool has_shard = false;
  for (int i = 0; i < nd; ++i)
    if (from[i].is_shard() && mesh.shape[i] > 1) has_shard = true;
  if (has_shard) {
    // Inner to outer: a target S(d) whose earlier mesh dims shard d differently than now
    // (nested sharding that must be undone first) goes through R on this dim.
    for (int i = nd - 1; i >= 0 && p.ok(); --i) {
      Placement target = to[i];
      if (target.is_shard()) {
        const Layout& cur = p.current();
        for (int k = 0; k < i; ++k)
          if (cur[k].is_shard(target.dim) != to[k].is_shard(target.dim)) {
            target = Placement::replicate();
            break;
          }
      }
      p.step(i, target);
    }
  }
  for (int i = 0; i < nd && p.ok(); ++i) p.step(i, to[i]);
  return p.result;
}

int32_t RedistributionCache::intern(const TensorMeta& global) {
  std::string key;
  key.reserve(8 * (global.shape.size() + 1));
  auto put = [&](uint64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<uint64_t>(global.dtype));
  for (int64_t s : global.shape) put(static_cast<uint64_t>(s));
  auto [it, fresh] = meta_ids_.emplace(std::move(key), static_cast<int32_t>(metas_.size()));
  if (fresh) metas_.push_back(global);
  return it->second;
}

int32_t RedistributionCache::intern(const Layout& layout) {
  auto [it, fresh] = layout_ids_.emplace(layout_code(layout), static_cast<int32_t>(layouts_.size()));
  if (fresh) layouts_.push_back(layout);
  return it->second;
}

const RedistributionCache::Entry& RedistributionCache::entry(int32_t meta_id, int32_t from_id, int32_t to_id) {
  if (times_.size() <= static_cast<size_t>(meta_id)) times_.resize(meta_id + 1);
  auto& rows = times_[meta_id];
  if (rows.size() <= static_cast<size_t>(from_id)) rows.resize(from_id + 1);
  auto& row = rows[from_id];
  if (row.size() <= static_cast<size_t>(to_id)) row.resize(to_id + 1);
  Entry& e = row[to_id];
  if (std::isnan(e.time_us)) {
    Redistribution r = plan_redistribution(metas_.at(meta_id), layouts_.at(from_id), layouts_.at(to_id), model_);
    e.time_us = r.time_us;
    e.collectives = r.feasible ? r.collectives : 0;
    ++computed_;
  }
  return e;
}

double RedistributionCache::time_us(int32_t meta_id, int32_t from_id, int32_t to_id) {
  if (from_id == to_id) return 0.0;
  return entry(meta_id, from_id, to_id).time_us;
}

int RedistributionCache::collectives(int32_t meta_id, int32_t from_id, int32_t to_id) {
  if (from_id == to_id) return 0;
  return entry(meta_id, from_id, to_id).collectives;
}

int RedistributionCache::collectives(const TensorMeta& global, const Layout& from, const Layout& to) {
  if (from == to) return 0;
  return collectives(intern(global), intern(from), intern(to));
}

double RedistributionCache::time_us(const TensorMeta& global, const Layout& from, const Layout& to) {
  if (from == to) return 0.0;
  return time_us(intern(global), intern(from), intern(to));
}

}  // namespace autoshard
