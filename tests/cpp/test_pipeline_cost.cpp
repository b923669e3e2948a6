// The pipeline pricing (pipeline.h): step times against the closed forms of uniform stages,
// the activations each schedule keeps in flight, sends and reductions, that every order
// runs each (stage, microbatch) forward once and its backward once after it, the balanced
// split against brute force, and the input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>

#include "autoshard/pipeline.h"

using namespace autoshard;

namespace {

PipelineSpec spec(PipelineSchedule s, int ranks, int microbatches, double latency_us = 0) {
  PipelineSpec p;
  p.schedule = s;
  p.ranks = ranks;
  p.microbatches = microbatches;
  p.p2p_bytes_per_s = 1e9;
  p.p2p_latency_us = latency_us;
  return p;
}

std::vector<StageCost> uniform(int count, double f, double b, int64_t saved = 0, int64_t send = 0) {
  return std::vector<StageCost>(count, StageCost{f, b, saved, 1000, send});
}

const PipelineSchedule kSingle[] = {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB};

}  // namespace

TEST(PipelineCost, ScheduleNamesAreTorchs) {
  for (auto s : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved1F1B})
    EXPECT_EQ(parse_pipeline_schedule(pipeline_schedule_name(s)), s);
  EXPECT_STREQ(pipeline_schedule_name(PipelineSchedule::OneFOneB), "1F1B");
  EXPECT_THROW(parse_pipeline_schedule("ZeroBubble"), std::invalid_argument);
}

TEST(PipelineCost, UniformStagesTakeMicrobatchesPlusRanksMinusOneSlots) {
  for (auto s : kSingle)
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 8, 13})
        for (auto [f, b] : {std::pair{1.0, 2.0}, {3.0, 1.0}, {2.5, 2.5}}) {
          PipelineEstimate e = price_pipeline(spec(s, p, m), uniform(p, f, b));
          EXPECT_NEAR(e.step_us, (m + p - 1) * (f + b), 1e-9) << pipeline_schedule_name(s) << " p=" << p << " m=" << m;
          EXPECT_NEAR(e.bubble_fraction, (p - 1.0) / (m + p - 1.0), 1e-12);
        }
}

TEST(PipelineCost, InterleavedShrinksTheBubbleByTheChunks) {
  for (int p : {1, 2, 4})
    for (int v : {1, 2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        double f = 1.5;  // per chunk, backward as long as forward
        PipelineEstimate e = price_pipeline(spec(PipelineSchedule::Interleaved1F1B, p, m), uniform(p * v, f, f));
        EXPECT_NEAR(e.step_us, (m * v + p - 1) * 2 * f, 1e-9) << "p=" << p << " v=" << v << " m=" << m;
        EXPECT_EQ(e.virtual_stages, v);
      }
}

TEST(PipelineCost, ActivationsInFlight) {
  const int p = 4, m = 8;
  const int64_t saved = 100, resident = 1000;
  PipelineEstimate gpipe = price_pipeline(spec(PipelineSchedule::GPipe, p, m), uniform(p, 1, 2, saved));
  PipelineEstimate one = price_pipeline(spec(PipelineSchedule::OneFOneB, p, m), uniform(p, 1, 2, saved));
  PipelineEstimate inter = price_pipeline(spec(PipelineSchedule::Interleaved1F1B, p, m), uniform(2 * p, 1, 2, saved));
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(gpipe.rank_peak_in_flight[r], m);
    EXPECT_EQ(one.rank_peak_in_flight[r], std::min(m, p - r));
    EXPECT_EQ(one.rank_peak_bytes[r], resident + saved * std::min(m, p - r));
    // Interleaved: warmup 2 (p - r - 1) + (v - 1) p forwards, then one more before a backward.
    EXPECT_EQ(inter.rank_peak_in_flight[r], std::min(2 * m, 2 * (p - r - 1) + p + 1));
    EXPECT_EQ(inter.rank_peak_bytes[r], 2 * resident + saved * inter.rank_peak_in_flight[r]);
  }
  EXPECT_GT(inter.rank_peak_in_flight[0], one.rank_peak_in_flight[0]);
  // Fewer microbatches than ranks: 1F1B holds all of them, like GPipe.
  PipelineEstimate few = price_pipeline(spec(PipelineSchedule::OneFOneB, p, 2), uniform(p, 1, 2, saved));
  EXPECT_EQ(few.rank_peak_in_flight[0], 2);
}

TEST(PipelineCost, SendsAddTwoHopsPerBoundaryOnTheCriticalPath) {
  const int p = 4, m = 6;
  const double f = 2, b = 3, latency = 0.5;
  PipelineEstimate e = price_pipeline(spec(PipelineSchedule::GPipe, p, m, latency), uniform(p, f, b));
  EXPECT_NEAR(e.step_us, (m + p - 1) * (f + b) + 2 * (p - 1) * latency, 1e-9);
  // 2000 bytes at 1e9 B/s: 2 us each way per boundary.
  e = price_pipeline(spec(PipelineSchedule::GPipe, p, m, latency), uniform(p, f, b, 0, 2000));
  EXPECT_NEAR(e.step_us, (m + p - 1) * (f + b) + 2 * (p - 1) * (latency + 2), 1e-9);
  // One slow (inter-node) link between ranks 1 and 2 adds its own price instead.
  PipelineSpec s = spec(PipelineSchedule::GPipe, p, m, latency);
  s.links.assign(p, PipelineLink{1e9, latency});
  s.links[1] = PipelineLink{1e8, 10};
  e = price_pipeline(s, uniform(p, f, b, 0, 2000));
  EXPECT_NEAR(e.step_us, (m + p - 1) * (f + b) + 2 * (2 * (latency + 2) + 10 + 20), 1e-9);
  // One rank, several stages: nothing is sent.
  e = price_pipeline(spec(PipelineSchedule::Interleaved1F1B, 1, 2, 100), uniform(3, f, b, 0, 2000));
  EXPECT_NEAR(e.step_us, 2 * 3 * (f + b), 1e-9);
}

TEST(PipelineCost, ReductionsEndTheStepPerRank) {
  PipelineSpec s = spec(PipelineSchedule::OneFOneB, 2, 4);
  s.reduction_us = {1, 30};
  PipelineEstimate e = price_pipeline(s, uniform(2, 1, 1));
  // Rank 1's last backward ends one backward before rank 0's (at 10 - 1 = 9 us).
  EXPECT_NEAR(e.makespan_us, 10, 1e-9);
  EXPECT_NEAR(e.step_us, 9 + 30, 1e-9);
  EXPECT_NEAR(e.bubble_fraction, 1 - 16.0 / 20, 1e-12);
}

TEST(PipelineCost, EveryOrderRunsEachForwardAndBackwardOnceInDependencyOrder) {
  std::mt19937 rng(44);
  std::uniform_real_distribution<double> us(0.1, 5);
  for (auto sched : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved1F1B})
    for (int p : {1, 2, 3, 5})
      for (int v : {1, 2, 3})
        for (int m : {1, 2, 3, 5, 6, 10, 15}) {
          if (sched != PipelineSchedule::Interleaved1F1B && v > 1) continue;
          if (sched == PipelineSchedule::Interleaved1F1B && m % p != 0) continue;
          std::vector<StageCost> stages;
          for (int i = 0; i < p * v; ++i) stages.push_back(StageCost{us(rng), us(rng), 7, 0, 5000});
          PipelineEstimate e = price_pipeline(spec(sched, p, m, us(rng)), stages);
          std::vector<double> f_end(p * v * m, -1), b_end(p * v * m, -1);
          for (int r = 0; r < p; ++r) {
            double free_at = 0;
            for (const PipelineAction& a : e.timeline[r]) {
              ASSERT_EQ(a.stage % p, r);
              ASSERT_GE(a.start_us, free_at - 1e-9);
              free_at = a.end_us;
              double& end = (a.kind == 'F' ? f_end : b_end)[a.stage * m + a.microbatch];
              ASSERT_EQ(end, -1) << "ran twice";
              end = a.end_us;
            }
            EXPECT_EQ(e.rank_peak_bytes[r] % 7, 0);
          }
          for (int s = 0; s < p * v; ++s)
            for (int i = 0; i < m; ++i) {
              ASSERT_GE(f_end[s * m + i], 0);
              ASSERT_GE(b_end[s * m + i], f_end[s * m + i]);
              if (s > 0) ASSERT_LT(f_end[(s - 1) * m + i], f_end[s * m + i]);
              if (s + 1 < p * v) ASSERT_GT(b_end[s * m + i], b_end[(s + 1) * m + i]);
            }
        }
}

TEST(PipelineInput, ErrorsNameTheValues) {
  auto message = [](const PipelineSpec& s, const std::vector<StageCost>& stages) {
    try {
      price_pipeline(s, stages);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(spec(PipelineSchedule::GPipe, 2, 0), uniform(2, 1, 1)).find("microbatches must be at least 1"),
            std::string::npos);
  EXPECT_NE(message(spec(PipelineSchedule::GPipe, 2, 2), uniform(3, 1, 1)).find("3 stages do not split evenly over 2"),
            std::string::npos);
  EXPECT_NE(message(spec(PipelineSchedule::OneFOneB, 2, 2), uniform(4, 1, 1)).find("use Interleaved1F1B"),
            std::string::npos);
  EXPECT_NE(message(spec(PipelineSchedule::Interleaved1F1B, 4, 6), uniform(8, 1, 1)).find("use 8 microbatches"),
            std::string::npos);
  EXPECT_NE(message(spec(PipelineSchedule::GPipe, 2, 2), uniform(2, -1, 1)).find("stage 0 forward_us"),
            std::string::npos);
  EXPECT_NE(message(spec(PipelineSchedule::GPipe, 2, 2), uniform(2, 1, NAN)).find("nan"), std::string::npos);
  EXPECT_NE(message(spec(PipelineSchedule::GPipe, 2, 2, -1), uniform(2, 1, 1)).find("p2p latency"), std::string::npos);
  PipelineSpec s = spec(PipelineSchedule::GPipe, 2, 2);
  s.reduction_us = {1};
  EXPECT_NE(message(s, uniform(2, 1, 1)).find("reduction_us gives 1 times for 2 ranks"), std::string::npos);
  EXPECT_THROW(balanced_split({1, 2}, 3, 0, 0), std::invalid_argument);
  EXPECT_THROW(balanced_split({1, -2}, 1, 0, 0), std::invalid_argument);
  EXPECT_THROW(balanced_split({1, 2}, 2, -1, 0), std::invalid_argument);
}

namespace {

// The slowest part of the split at `starts`.
double slowest(const std::vector<double>& layers, const std::vector<int>& starts, double first, double last) {
  double worst = 0;
  for (size_t j = 0; j < starts.size(); ++j) {
    size_t end = j + 1 < starts.size() ? starts[j + 1] : layers.size();
    double t = (j == 0 ? first : 0) + (j + 1 == starts.size() ? last : 0);
    for (size_t i = starts[j]; i < end; ++i) t += layers[i];
    worst = std::max(worst, t);
  }
  return worst;
}

// Every split of n layers into k non-empty parts (every composition).
double brute_force(const std::vector<double>& layers, int k, double first, double last) {
  double best = INFINITY;
  std::vector<int> starts{0};
  std::function<void()> go = [&]() {
    int n = static_cast<int>(layers.size());
    if (static_cast<int>(starts.size()) == k) {
      best = std::min(best, slowest(layers, starts, first, last));
      return;
    }
    for (int a = starts.back() + 1; a <= n - (k - static_cast<int>(starts.size())); ++a) {
      starts.push_back(a);
      go();
      starts.pop_back();
    }
  };
  go();
  return best;
}

}  // namespace

TEST(PipelineSplit, BalancedSplitMatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> us(0, 10);
  for (int trial = 0; trial < 300; ++trial) {
    int n = 1 + static_cast<int>(rng() % 9);
    int k = 1 + static_cast<int>(rng() % n);
    std::vector<double> layers(n);
    for (double& x : layers) x = us(rng);
    double first = trial % 3 == 0 ? 0 : us(rng), last = trial % 2 == 0 ? 0 : 2 * us(rng);
    std::vector<int> starts = balanced_split(layers, k, first, last);
    ASSERT_EQ(static_cast<int>(starts.size()), k);
    ASSERT_EQ(starts[0], 0);
    for (int j = 1; j < k; ++j) ASSERT_LT(starts[j - 1], starts[j]);
    ASSERT_LT(starts.back(), n);
    EXPECT_NEAR(slowest(layers, starts, first, last), brute_force(layers, k, first, last), 1e-9);
  }
}

TEST(PipelineSplit, HeavyEndsGetFewerLayers) {
  // Eight equal layers; the head and loss cost four layers: the last stage gets fewer.
  std::vector<int> starts = balanced_split(std::vector<double>(8, 1.0), 2, 0, 4);
  EXPECT_EQ(starts, (std::vector<int>{0, 6}));
}
