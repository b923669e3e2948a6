// A discrete-event run of each rank's order: an action starts when its rank is free and its
// inputs have arrived, and runs for its stage's time. Sends overlap compute (a rank never
// waits on its own send), and each is priced alone on its link: no contention.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "autoshard/pipeline.h"
#include "check_input.h"

namespace autoshard {
namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();

class Simulation {
 public:
  Simulation(const PipelineSpec& spec, const std::vector<StageCost>& stages)
      : spec_(spec),
        stages_(stages),
        m_(spec.microbatches),
        f_end_(stages.size() * m_, kNotYet),
        b_end_(stages.size() * m_, kNotYet) {}

  // Runs the orders in place (their start and end times).
  void run(std::vector<std::vector<PipelineAction>>& orders) {
    std::vector<size_t> next(orders.size(), 0);
    std::vector<double> free_at(orders.size(), 0);
    size_t left = 0;
    for (auto& o : orders) left += o.size();
    while (left > 0) {
      size_t ran = 0;
      for (size_t r = 0; r < orders.size(); ++r) ran += advance(orders[r], next[r], free_at[r]);
      if (ran == 0) throw std::logic_error("pipeline: the orders deadlock: " + stuck(orders, next));
      left -= ran;
    }
  }

 private:
  // Runs rank's actions from `next` while their inputs are there; returns how many ran.
  size_t advance(std::vector<PipelineAction>& order, size_t& next, double& free_at) {
    size_t ran = 0;
    for (; next < order.size(); ++next, ++ran) {
      PipelineAction& a = order[next];
      double ready = ready_at(a);
      if (std::isnan(ready)) break;
      const StageCost& c = stages_[a.stage];
      a.start_us = std::max(free_at, ready);
      a.end_us = a.start_us + (a.kind == 'F' ? c.forward_us : c.backward_us);
      free_at = a.end_us;
      (a.kind == 'F' ? f_end_ : b_end_)[index(a.stage, a.microbatch)] = a.end_us;
    }
    return ran;
  }

  // When the action's inputs are on its rank; NaN while one is not computed yet.
  double ready_at(const PipelineAction& a) const {
    int last = static_cast<int>(stages_.size()) - 1;
    if (a.kind == 'F') return a.stage == 0 ? 0.0 : f_end_[index(a.stage - 1, a.microbatch)] + send_us(a.stage - 1);
    double own = f_end_[index(a.stage, a.microbatch)];
    if (a.stage == last) return own;  // the loss's gradient starts here
    double grad = b_end_[index(a.stage + 1, a.microbatch)] + send_us(a.stage);
    return std::isnan(own) || std::isnan(grad) ? kNotYet : std::max(own, grad);
  }

  // The send between stage s and s + 1 (the activation forward, its gradient back).
  double send_us(int s) const {
    int from = s % spec_.ranks;
    if ((s + 1) % spec_.ranks == from) return 0;  // one rank: the tensor stays where it is
    double bw = spec_.links.empty() ? spec_.p2p_bytes_per_s : spec_.links[from].bytes_per_s;
    double lat = spec_.links.empty() ? spec_.p2p_latency_us : spec_.links[from].latency_us;
    return lat + static_cast<double>(stages_[s].send_bytes) / bw * 1e6;
  }

  size_t index(int stage, int microbatch) const { return static_cast<size_t>(stage) * m_ + microbatch; }

  static std::string stuck(const std::vector<std::vector<PipelineAction>>& orders, const std::vector<size_t>& next) {
    std::string s;
    for (size_t r = 0; r < orders.size(); ++r) {
      if (next[r] >= orders[r].size()) continue;
      const PipelineAction& a = orders[r][next[r]];
      s += "rank " + std::to_string(r) + " waits at " + a.kind + "(stage " + std::to_string(a.stage) +
           ", microbatch " + std::to_string(a.microbatch) + "); ";
    }
    return s;
  }

  const PipelineSpec& spec_;
  const std::vector<StageCost>& stages_;
  size_t m_;
  std::vector<double> f_end_, b_end_;
};

// Per rank: resident bytes of its stages plus the most saved activations held at once (a
// forward adds its microbatch's, the matching backward frees them).
void add_memory(PipelineEstimate& e, const std::vector<StageCost>& stages) {
  size_t ranks = e.timeline.size();
  for (size_t r = 0; r < ranks; ++r) {
    int64_t resident = 0, held = 0, peak = 0;
    int count = 0, peak_count = 0;
    for (size_t s = r; s < stages.size(); s += ranks) resident += stages[s].resident_bytes;
    for (const PipelineAction& a : e.timeline[r]) {
      int sign = a.kind == 'F' ? 1 : -1;
      held += sign * stages[a.stage].saved_bytes;
      count += sign;
      peak = std::max(peak, held);
      peak_count = std::max(peak_count, count);
    }
    e.rank_peak_bytes.push_back(resident + peak);
    e.rank_peak_in_flight.push_back(peak_count);
  }
}

void add_times(PipelineEstimate& e, const PipelineSpec& spec) {
  double busy_sum = 0;
  for (size_t r = 0; r < e.timeline.size(); ++r) {
    double busy = 0, end = 0;
    for (const PipelineAction& a : e.timeline[r]) {
      busy += a.end_us - a.start_us;
      end = std::max(end, a.end_us);
    }
    e.rank_busy_us.push_back(busy);
    busy_sum += busy;
    e.makespan_us = std::max(e.makespan_us, end);
    e.step_us = std::max(e.step_us, end + (spec.reduction_us.empty() ? 0.0 : spec.reduction_us[r]));
  }
  double capacity = static_cast<double>(spec.ranks) * e.makespan_us;
  e.bubble_fraction = capacity > 0 ? 1 - busy_sum / capacity : 0;
}

}  // namespace

PipelineEstimate price_pipeline(const PipelineSpec& spec, const std::vector<StageCost>& stages) {
  PipelineEstimate e;
  e.virtual_stages = pipeline_detail::check_pipeline_input(spec, stages);
  e.timeline = pipeline_orders(spec.schedule, spec.ranks, e.virtual_stages, spec.microbatches);
  Simulation(spec, stages).run(e.timeline);
  add_times(e, spec);
  add_memory(e, stages);
  return e;
}

}  // namespace autoshard
