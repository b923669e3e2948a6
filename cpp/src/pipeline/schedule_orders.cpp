// Each rank's order of forwards and backwards, written from the schedules' definitions.
// Checked against torch 2.13 (torch/distributed/pipelining/schedules.py):
// - GPipe: every forward, then every backward, both in microbatch order (ScheduleGPipe).
// - 1F1B: rank r runs min(m, p - r - 1) forwards, then one forward and one backward in turn,
//   then the remaining backwards. torch's Schedule1F1B says "min(m, p - r) forwards, then
//   backward and forward in turn": the same sequence. torch refuses m < p; this order takes
//   it (every forward is then warmup).
// - Interleaved 1F1B (v chunks per rank, stage c * p + r): forwards go p microbatches through
//   chunk 0, the same p through chunk 1, ..., then the next p microbatches; backwards the
//   same with the chunks reversed. Warmup min(m * v, 2 (p - r - 1) + (v - 1) p) forwards, then
//   one forward and one backward in turn, then the rest. torch also takes m % p != 0 (its
//   rounds of m / (m / p) microbatches); this requires m % p == 0, where the two agree.
// torch's "None" slots (idle steps that align ranks in its step-synchronous IR) are not
// actions here: the simulation waits on the data a step needs instead.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "autoshard/pipeline.h"

namespace autoshard {
namespace {

using Order = std::vector<PipelineAction>;

PipelineAction act(char kind, int stage, int microbatch) { return PipelineAction{kind, stage, microbatch, 0, 0}; }

Order gpipe_order(int r, int m) {
  Order o;
  for (int i = 0; i < m; ++i) o.push_back(act('F', r, i));
  for (int i = 0; i < m; ++i) o.push_back(act('B', r, i));
  return o;
}

// Forwards f(k) and backwards b(k), k in [0, n), with `warmup` forwards run first.
template <typename F, typename B>
Order one_f_one_b(int n, int warmup, F f, B b) {
  Order o;
  for (int k = 0; k < warmup; ++k) o.push_back(f(k));
  for (int k = warmup; k < n; ++k) {
    o.push_back(f(k));
    o.push_back(b(k - warmup));
  }
  for (int k = n - warmup; k < n; ++k) o.push_back(b(k));
  return o;
}

Order interleaved_order(int r, int p, int v, int m) {
  int round = p * v;
  auto microbatch = [&](int k) { return k / round * p + k % p; };
  auto fwd = [&](int k) { return act('F', (k % round / p) * p + r, microbatch(k)); };
  auto bwd = [&](int k) { return act('B', (v - 1 - k % round / p) * p + r, microbatch(k)); };
  int n = m * v;
  return one_f_one_b(n, std::min(n, 2 * (p - r - 1) + (v - 1) * p), fwd, bwd);
}

void check_sizes(PipelineSchedule schedule, int ranks, int virtual_stages, int microbatches) {
  if (ranks < 1) throw std::invalid_argument("pipeline: ranks must be at least 1, got " + std::to_string(ranks));
  if (microbatches < 1)
    throw std::invalid_argument("pipeline: microbatches must be at least 1, got " + std::to_string(microbatches));
  if (virtual_stages < 1)
    throw std::invalid_argument("pipeline: stages per rank must be at least 1, got " + std::to_string(virtual_stages));
  std::string name = pipeline_schedule_name(schedule);
  if (schedule != PipelineSchedule::Interleaved1F1B && virtual_stages != 1)
    throw std::invalid_argument("pipeline: " + name + " runs one stage per rank, got " +
                                std::to_string(virtual_stages) + " per rank on " + std::to_string(ranks) +
                                " ranks; give one stage per rank or use Interleaved1F1B");
  if (schedule == PipelineSchedule::Interleaved1F1B && microbatches % ranks != 0)
    throw std::invalid_argument("pipeline: Interleaved1F1B needs the microbatches (" + std::to_string(microbatches) +
                                ") to be a multiple of the pipeline ranks (" + std::to_string(ranks) +
                                "); use " + std::to_string((microbatches / ranks + 1) * ranks) +
                                " microbatches or another schedule");
}

}  // namespace

PipelineSchedule parse_pipeline_schedule(std::string_view name) {
  if (name == "GPipe") return PipelineSchedule::GPipe;
  if (name == "1F1B") return PipelineSchedule::OneFOneB;
  if (name == "Interleaved1F1B") return PipelineSchedule::Interleaved1F1B;
  throw std::invalid_argument("unknown pipeline schedule '" + std::string(name) +
                              "'; expected GPipe, 1F1B or Interleaved1F1B");
}

const char* pipeline_schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::GPipe: return "GPipe";
    case PipelineSchedule::OneFOneB: return "1F1B";
    case PipelineSchedule::Interleaved1F1B: return "Interleaved1F1B";
  }
  return "?";
}

std::vector<Order> pipeline_orders(PipelineSchedule schedule, int ranks, int virtual_stages, int microbatches) {
  check_sizes(schedule, ranks, virtual_stages, microbatches);
  std::vector<Order> orders;
  for (int r = 0; r < ranks; ++r) {
    int p = ranks, m = microbatches;
    switch (schedule) {
      case PipelineSchedule::GPipe: orders.push_back(gpipe_order(r, m)); break;
      case PipelineSchedule::OneFOneB:
        orders.push_back(one_f_one_b(
            m, std::min(m, p - r - 1), [&](int k) { return act('F', r, k); }, [&](int k) { return act('B', r, k); }));
        break;
      case PipelineSchedule::Interleaved1F1B: orders.push_back(interleaved_order(r, p, virtual_stages, m)); break;
    }
  }
  return orders;
}

}  // namespace autoshard
