// Input checks of price_pipeline (check_input.h).
#include "check_input.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace autoshard::pipeline_detail {
namespace {

std::string num(double x) { return std::isnan(x) ? "nan" : std::to_string(x); }

void check_time(double us, const std::string& what) {
  if (!(std::isfinite(us) && us >= 0))
    throw std::invalid_argument("pipeline: " + what + " must be a finite time >= 0 us, got " + num(us));
}

void check_link(double bytes_per_s, double latency_us, const std::string& what) {
  // An infinite bandwidth is a free link (stages of one node priced as if sends cost nothing).
  if (!(bytes_per_s > 0))
    throw std::invalid_argument("pipeline: " + what + " bandwidth must be > 0 bytes/s, got " + num(bytes_per_s));
  check_time(latency_us, what + " latency");
}

void check_stage(const StageCost& c, size_t s) {
  std::string at = "stage " + std::to_string(s) + " ";
  check_time(c.forward_us, at + "forward_us");
  check_time(c.backward_us, at + "backward_us");
  if (c.saved_bytes < 0 || c.resident_bytes < 0 || c.send_bytes < 0)
    throw std::invalid_argument("pipeline: " + at + "has a negative byte count (saved " +
                                std::to_string(c.saved_bytes) + ", resident " + std::to_string(c.resident_bytes) +
                                ", send " + std::to_string(c.send_bytes) + ")");
}

}  // namespace

int check_pipeline_input(const PipelineSpec& spec, const std::vector<StageCost>& stages) {
  int p = spec.ranks;
  if (p < 1) throw std::invalid_argument("pipeline: ranks must be at least 1, got " + std::to_string(p));
  if (stages.empty() || stages.size() % static_cast<size_t>(p) != 0)
    throw std::invalid_argument("pipeline: " + std::to_string(stages.size()) + " stages do not split evenly over " +
                                std::to_string(p) + " ranks; give ranks x stages-per-rank stages");
  for (size_t s = 0; s < stages.size(); ++s) check_stage(stages[s], s);
  check_link(spec.p2p_bytes_per_s, spec.p2p_latency_us, "p2p");
  if (!spec.links.empty() && spec.links.size() != static_cast<size_t>(p))
    throw std::invalid_argument("pipeline: links gives " + std::to_string(spec.links.size()) + " links for " +
                                std::to_string(p) + " ranks; give one per rank (rank r -> r + 1) or none");
  for (size_t r = 0; r < spec.links.size(); ++r)
    check_link(spec.links[r].bytes_per_s, spec.links[r].latency_us, "link " + std::to_string(r));
  if (!spec.reduction_us.empty() && spec.reduction_us.size() != static_cast<size_t>(p))
    throw std::invalid_argument("pipeline: reduction_us gives " + std::to_string(spec.reduction_us.size()) +
                                " times for " + std::to_string(p) + " ranks; give one per rank or none");
  for (size_t r = 0; r < spec.reduction_us.size(); ++r)
    check_time(spec.reduction_us[r], "reduction_us of rank " + std::to_string(r));
  return static_cast<int>(stages.size() / static_cast<size_t>(p));
}

}  // namespace autoshard::pipeline_detail
