// The price of a pipeline-parallel step (issue 44): each rank's order of forwards and
// backwards under a schedule, a discrete-event run of those orders over per-microbatch stage
// times and the sends between ranks, the bubble, the activations each rank keeps in flight,
// and a split of a layer stack into stages balanced by time. The runtime is torch's
// (python/autoshard/pipeline); this prices the choices it is given. docs/pipeline.md,
// "Pricing a pipeline".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace autoshard {

// The schedules torch.distributed.pipelining ships under these names (ScheduleGPipe,
// Schedule1F1B, ScheduleInterleaved1F1B).
enum class PipelineSchedule { GPipe, OneFOneB, Interleaved1F1B };

// "GPipe", "1F1B", "Interleaved1F1B"; std::invalid_argument naming the known ones otherwise.
PipelineSchedule parse_pipeline_schedule(std::string_view name);
const char* pipeline_schedule_name(PipelineSchedule s);

// One stage, one microbatch.
struct StageCost {
  double forward_us = 0;
  double backward_us = 0;
  int64_t saved_bytes = 0;     // activations one microbatch keeps from its forward to its backward
  int64_t resident_bytes = 0;  // weights, gradients, optimizer state
  int64_t send_bytes = 0;      // activation to the next stage; its gradient comes back as large
};

// The link from pipeline rank r to rank (r + 1) % ranks, both ways.
struct PipelineLink {
  double bytes_per_s = 0;
  double latency_us = 0;
};

struct PipelineSpec {
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  int ranks = 1;
  int microbatches = 1;
  double p2p_bytes_per_s = 0;
  double p2p_latency_us = 0;
  // Per link (size ranks, link r: rank r -> r + 1) where they differ, e.g. a node boundary;
  // empty: every link is p2p_bytes_per_s / p2p_latency_us.
  std::vector<PipelineLink> links;
  // Per rank, the data-parallel gradient reduction after its last backward; empty: none.
  std::vector<double> reduction_us;
};

struct PipelineAction {
  char kind = 'F';  // 'F' forward, 'B' backward
  int stage = 0;
  int microbatch = 0;
  double start_us = 0;
  double end_us = 0;
};

struct PipelineEstimate {
  double step_us = 0;          // max over ranks of its last action's end + its reduction
  double makespan_us = 0;      // the last action's end, reductions left out
  double bubble_fraction = 0;  // 1 - sum(busy) / (ranks * makespan)
  int virtual_stages = 1;
  std::vector<double> rank_busy_us;
  std::vector<int64_t> rank_peak_bytes;  // resident + the most saved activations at once
  std::vector<int> rank_peak_in_flight;  // the most (stage, microbatch) forwards awaiting backward
  std::vector<std::vector<PipelineAction>> timeline;  // per rank, in the order it runs them
};

// Each rank's actions (times zero) under `schedule`, stage s on rank s % ranks. Throws
// std::invalid_argument on sizes the schedule does not take.
std::vector<std::vector<PipelineAction>> pipeline_orders(PipelineSchedule schedule, int ranks, int virtual_stages,
                                                         int microbatches);

// Runs the orders over `stages` (size ranks * virtual stages). std::invalid_argument on bad
// input; std::logic_error if the orders deadlock (a bug in an order, never the input's).
PipelineEstimate price_pipeline(const PipelineSpec& spec, const std::vector<StageCost>& stages);

// A contiguous split of the layers into `stages` non-empty parts whose slowest part is as fast
// as can be (the first part also pays first_extra_us, the last last_extra_us); each part's first
// layer index, ascending from 0.
std::vector<int> balanced_split(const std::vector<double>& layer_us, int stages, double first_extra_us = 0,
                                double last_extra_us = 0);

}  // namespace autoshard
