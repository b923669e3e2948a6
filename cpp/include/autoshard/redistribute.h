// Redistribution of one tensor between two layouts on an N-d mesh, with DTensor semantics
// (docs/formats.md section 3): the list of single-mesh-dim steps, their bytes and times.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "autoshard/cost_model.h"
#include "autoshard/graph.h"
#include "autoshard/mesh_model.h"
#include "autoshard/placement.h"

namespace autoshard {

enum class RedistStepKind {
  AllGather,       // S(d) -> R
  ReduceScatter,   // P -> S(d)
  AllReduce,       // P -> R
  AllToAll,        // S(i) -> S(j)
  LocalChunk,      // R -> S(d): each rank keeps its chunk, no communication
  LocalPartition,  // R -> P: sum divides by the group size, avg/max/min keep the value
};
const char* redist_step_name(RedistStepKind k);

struct RedistStep {
  int mesh_dim = 0;
  Placement from, to;
  RedistStepKind kind = RedistStepKind::LocalChunk;
  double bytes = 0;         // the collective's buffer (padded for uneven shards), 0 for local steps
  double comm_us = 0;       // collective time on the mesh dim's link
  double copy_us = 0;       // local re-layout (non-dim-0 gathers / scatters / all-to-alls, sum partition)
  std::string str() const;  // "mesh dim 1: S(0)->R all-gather 4096 B 12.3 us"
};

struct Redistribution {
  bool feasible = true;
  std::string reason;  // why it is infeasible
  std::vector<RedistStep> steps;
  double time_us = 0;   // sum of step comm + copy times (infinity when infeasible)
  int collectives = 0;  // steps that call a collective (each pays the link's launch cost)
};

// Steps from `from` to `to`, ordered like DTensor's planner: mesh dims inner to outer first
// (nested shardings that the target does not keep are gathered first, so gathers happen on
// inner dims first), then outer to inner for what is left. Infeasible: S->P, P(a)->P(b).
Redistribution plan_redistribution(const TensorMeta& global, const Layout& from, const Layout& to,
                                   const MeshModel& model);

// Memoised time of plan_redistribution (infinity when infeasible). Tensor metas are interned
// once so the hot lookup hashes three integers. Not thread-safe; one per planning run.
class RedistributionCache {
 public:
  explicit RedistributionCache(const MeshModel& model) : model_(model) {}
  double time_us(const TensorMeta& global, const Layout& from, const Layout& to);
  // The fast path: intern tensor metas and layouts once, then look up by their ids.
  int32_t intern(const TensorMeta& global);
  int32_t intern(const Layout& layout);
  double time_us(int32_t meta_id, int32_t from_id, int32_t to_id);
  // How many collectives the redistribution calls (0 when infeasible or local).
  int collectives(int32_t meta_id, int32_t from_id, int32_t to_id);
  int collectives(const TensorMeta& global, const Layout& from, const Layout& to);
  size_t size() const { return computed_; }

 private:
  const MeshModel& model_;
  std::vector<TensorMeta> metas_;
  std::unordered_map<std::string, int32_t> meta_ids_;
  std::vector<Layout> layouts_;
  std::unordered_map<uint64_t, int32_t> layout_ids_;
  struct Entry {
    double time_us = std::numeric_limits<double>::quiet_NaN();  // NaN: not computed yet
    int collectives = 0;
  };
  const Entry& entry(int32_t meta_id, int32_t from_id, int32_t to_id);
  // times_[meta][from] is a row indexed by `to`, grown on demand.
  std::vector<std::vector<std::vector<Entry>>> times_;
  size_t computed_ = 0;
};

}  // namespace autoshard
