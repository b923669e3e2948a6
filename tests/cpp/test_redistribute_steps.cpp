// Redistribution plans: the steps (which collective on which mesh dim, in which order) and the
// bytes are worked out by hand below; times are the cost model's collective time of exactly
// those bytes on that mesh dim's link (the cost model itself is tested by its own suite).
#include <gtest/gtest.h>

#include <cmath>

#include "autoshard/layout.h"
#include "autoshard/redistribute.h"

#include "test_layout_util.h"

using namespace autoshard;

namespace {
TensorMeta f32(std::vector<int64_t> shape) { return TensorMeta{std::move(shape), DType::Float32}; }

struct Redistribute : ::testing::Test {
  MeshModel m22 = MeshModel::make(Mesh{{2, 2}, {"dp", "tp"}}, "H100");
  MeshModel m4 = MeshModel::make(Mesh{{4}, {}}, "H100");
  double ag(const MeshModel& m, int dim, double bytes) {
    return collective_time_us(Collective::AllGather, bytes, m.links[dim]);
  }
  double rs(const MeshModel& m, int dim, double bytes) {
    return collective_time_us(Collective::ReduceScatter, bytes, m.links[dim]);
  }
  double ar(const MeshModel& m, int dim, double bytes) {
    return collective_time_us(Collective::AllReduce, bytes, m.links[dim]);
  }
  double a2a(const MeshModel& m, int dim, double bytes) {
    return collective_time_us(Collective::AllToAll, bytes, m.links[dim]);
  }
  double copy(const MeshModel& m, double bytes) { return memory_time_us(m.hw, 2 * bytes); }
};

void expect_step(const RedistStep& s, int dim, RedistStepKind kind, double bytes) {
  EXPECT_EQ(s.mesh_dim, dim) << s.str();
  EXPECT_EQ(s.kind, kind) << s.str();
  EXPECT_DOUBLE_EQ(s.bytes, bytes) << s.str();
}
}  // namespace

TEST_F(Redistribute, GathersInnerMeshDimFirst) {
  // [8,6] f32 S(0)S(0) -> RR: gather mesh dim 1 first (local [4,6] from [2,6] shards: 96 B),
  // then mesh dim 0 (the whole [8,6]: 192 B). Dim-0 gathers need no re-layout.
  auto r = plan_redistribution(f32({8, 6}), L({"S(0)", "S(0)"}), L({"R", "R"}), m22);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.steps.size(), 2u);
  expect_step(r.steps[0], 1, RedistStepKind::AllGather, 96);
  expect_step(r.steps[1], 0, RedistStepKind::AllGather, 192);
  EXPECT_DOUBLE_EQ(r.steps[0].copy_us, 0);
  EXPECT_DOUBLE_EQ(r.time_us, ag(m22, 1, 96) + ag(m22, 0, 192));
}

TEST_F(Redistribute, ReduceScatterOuterFirstFromPartial) {
  // P P -> S(0) S(0): no shard in the source, so outer to inner: reduce-scatter the full
  // 192 B buffer on mesh dim 0, then the [4,6] half (96 B) on mesh dim 1.
  auto r = plan_redistribution(f32({8, 6}), L({"P(sum)", "P(sum)"}), L({"S(0)", "S(0)"}), m22);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.steps.size(), 2u);
  expect_step(r.steps[0], 0, RedistStepKind::ReduceScatter, 192);
  expect_step(r.steps[1], 1, RedistStepKind::ReduceScatter, 96);
  EXPECT_DOUBLE_EQ(r.time_us, rs(m22, 0, 192) + rs(m22, 1, 96));
  // P -> R is an all-reduce of the local (here full) buffer.
  auto a = plan_redistribution(f32({8, 6}), L({"S(0)", "P(sum)"}), L({"S(0)", "R"}), m22);
  ASSERT_EQ(a.steps.size(), 1u);
  expect_step(a.steps[0], 1, RedistStepKind::AllReduce, 96);
  EXPECT_DOUBLE_EQ(a.time_us, ar(m22, 1, 96));
}

TEST_F(Redistribute, LocalStepsAreFree) {
  auto r = plan_redistribution(f32({8, 6}), L({"R", "R"}), L({"S(1)", "S(0)"}), m22);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].kind, RedistStepKind::LocalChunk);
  EXPECT_DOUBLE_EQ(r.time_us, 0);
  // R -> P(max) keeps the value; R -> P(sum) divides it (one pass over the 192 B).
  auto pmax = plan_redistribution(f32({8, 6}), L({"R"}), L({"P(max)"}), m4);
  ASSERT_EQ(pmax.steps.size(), 1u);
  EXPECT_EQ(pmax.steps[0].kind, RedistStepKind::LocalPartition);
  EXPECT_DOUBLE_EQ(pmax.time_us, 0);
  auto psum = plan_redistribution(f32({8, 6}), L({"R"}), L({"P(sum)"}), m4);
  EXPECT_DOUBLE_EQ(psum.time_us, copy(m4, 192));
  EXPECT_DOUBLE_EQ(plan_redistribution(f32({8, 6}), L({"S(0)"}), L({"S(0)"}), m4).time_us, 0);
}

TEST_F(Redistribute, AllToAllWithRelayout) {
  // S(0) -> S(1) on mesh dim 0 of (2,2): per-rank buffer = [8,6] / 2 = 96 B; the new dim 1 is
  // not leading, so one local re-layout of the buffer.
  auto r = plan_redistribution(f32({8, 6}), L({"S(0)", "R"}), L({"S(1)", "R"}), m22);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.steps.size(), 1u);
  expect_step(r.steps[0], 0, RedistStepKind::AllToAll, 96);
  EXPECT_DOUBLE_EQ(r.time_us, a2a(m22, 0, 96) + copy(m22, 96));
}

TEST_F(Redistribute, UnevenShardsArePadded) {
  // [5,8] S(0) over 4 ranks: chunks 2,2,1,0 are padded to 2 rows -> an 8-row buffer, 256 B.
  auto r = plan_redistribution(f32({5, 8}), L({"S(0)"}), L({"R"}), m4);
  ASSERT_EQ(r.steps.size(), 1u);
  expect_step(r.steps[0], 0, RedistStepKind::AllGather, 8 * 8 * 4);
  EXPECT_DOUBLE_EQ(r.time_us, ag(m4, 0, 256));
  // Gathering a non-leading dim costs a re-layout of the gathered buffer.
  auto c = plan_redistribution(f32({8, 5}), L({"S(1)"}), L({"R"}), m4);
  expect_step(c.steps[0], 0, RedistStepKind::AllGather, 256);
  EXPECT_DOUBLE_EQ(c.time_us, ag(m4, 0, 256) + copy(m4, 256));
  // ... unless every dim before it has size 1.
  auto d = plan_redistribution(f32({1, 8}), L({"S(1)"}), L({"R"}), m4);
  EXPECT_DOUBLE_EQ(d.time_us, ag(m4, 0, 32));
}

TEST_F(Redistribute, NestedShardingIsUndoneFirst) {
  // (S0,S0) -> (R,S0): the tp shard of dim 0 sits inside the dp shard, so it must be gathered
  // (96 B), then dp gathered (192 B), then tp re-chunked locally.
  auto r = plan_redistribution(f32({8, 6}), L({"S(0)", "S(0)"}), L({"R", "S(0)"}), m22);
  ASSERT_TRUE(r.feasible);
  ASSERT_EQ(r.steps.size(), 3u);
  expect_step(r.steps[0], 1, RedistStepKind::AllGather, 96);
  expect_step(r.steps[1], 0, RedistStepKind::AllGather, 192);
  expect_step(r.steps[2], 1, RedistStepKind::LocalChunk, 0);
  EXPECT_DOUBLE_EQ(r.time_us, ag(m22, 1, 96) + ag(m22, 0, 192));
}

TEST_F(Redistribute, ForbiddenTransitions) {
  auto sp = plan_redistribution(f32({8, 6}), L({"S(0)", "R"}), L({"P(sum)", "R"}), m22);
  EXPECT_FALSE(sp.feasible);
  EXPECT_TRUE(std::isinf(sp.time_us));
  EXPECT_NE(sp.reason.find("Shard -> Partial"), std::string::npos);
  auto pp = plan_redistribution(f32({8, 6}), L({"P(sum)"}), L({"P(max)"}), m4);
  EXPECT_FALSE(pp.feasible);
  RedistributionCache cache(m4);
  EXPECT_TRUE(std::isinf(cache.time_us(f32({8, 6}), L({"P(sum)"}), L({"P(max)"}))));
}

TEST_F(Redistribute, SizeOneMeshDimIsANoOp) {
  auto m14 = MeshModel::make(Mesh{{1, 4}, {}}, "H100");
  auto r = plan_redistribution(f32({8, 6}), L({"S(0)", "R"}), L({"R", "R"}), m14);
  EXPECT_TRUE(r.steps.empty());
  EXPECT_DOUBLE_EQ(r.time_us, 0);
}

TEST_F(Redistribute, CacheMatchesThePlanner) {
  RedistributionCache cache(m22);
  auto meta = f32({64, 32});
  std::vector<Layout> all;
  for (const char* a : {"R", "S(0)", "S(1)", "P(sum)"})
    for (const char* b : {"R", "S(0)", "S(1)", "P(sum)"}) all.push_back(L({a, b}));
  for (const auto& x : all)
    for (const auto& y : all) {
      double want = plan_redistribution(meta, x, y, m22).time_us;
      double got = cache.time_us(meta, x, y);
      if (std::isinf(want))
        EXPECT_TRUE(std::isinf(got));
      else
        EXPECT_DOUBLE_EQ(got, want) << layout_str(x) << " -> " << layout_str(y);
      EXPECT_EQ(cache.time_us(meta, x, y), got);  // a second lookup hits the cache
    }
}
