// Pipeline pricing (autoshard/pipeline.h) for Python: `price_pipeline` runs a schedule over
// per-stage costs and returns the step, the bubble, per-rank memory and the timeline;
// `balanced_split` cuts layer times into stages. Bad input raises ValueError with the C++
// message.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "autoshard/pipeline.h"
#include "bindings.h"

namespace nb = nanobind;

namespace autoshard::bindings {
namespace {

// A stage from {"forward_us", "backward_us", "saved_bytes", "resident_bytes", "send_bytes"};
// the times are required, a byte count left out is 0.
StageCost stage_from(const nb::dict& d, size_t index) {
  StageCost c;
  bool forward = false, backward = false;
  for (auto [key, value] : d) {
    std::string k = nb::cast<std::string>(key);
    if (k == "forward_us") c.forward_us = nb::cast<double>(value), forward = true;
    else if (k == "backward_us") c.backward_us = nb::cast<double>(value), backward = true;
    else if (k == "saved_bytes") c.saved_bytes = nb::cast<int64_t>(value);
    else if (k == "resident_bytes") c.resident_bytes = nb::cast<int64_t>(value);
    else if (k == "send_bytes") c.send_bytes = nb::cast<int64_t>(value);
    else
      throw std::invalid_argument("stage " + std::to_string(index) + ": unknown key '" + k +
                                  "'; expected forward_us, backward_us, saved_bytes, resident_bytes, send_bytes");
  }
  if (!forward || !backward)
    throw std::invalid_argument("stage " + std::to_string(index) + ": forward_us and backward_us are required");
  return c;
}

// Links as [{"bytes_per_s": .., "latency_us": ..}, ...] (rank r -> r + 1), or None.
std::vector<PipelineLink> links_from(const nb::object& links) {
  std::vector<PipelineLink> out;
  if (links.is_none()) return out;
  for (nb::handle h : links) {
    nb::dict d = nb::cast<nb::dict>(h);
    if (!d.contains("bytes_per_s") || !d.contains("latency_us") || d.size() != 2)
      throw std::invalid_argument("a link is {\"bytes_per_s\": float, \"latency_us\": float}");
    out.push_back(PipelineLink{nb::cast<double>(d["bytes_per_s"]), nb::cast<double>(d["latency_us"])});
  }
  return out;
}

nb::dict estimate_dict(const PipelineSpec& spec, const PipelineEstimate& e) {
  nb::dict d;
  d["schedule"] = pipeline_schedule_name(spec.schedule);
  d["ranks"] = spec.ranks;
  d["microbatches"] = spec.microbatches;
  d["virtual_stages"] = e.virtual_stages;
  d["step_us"] = e.step_us;
  d["makespan_us"] = e.makespan_us;
  d["bubble_fraction"] = e.bubble_fraction;
  d["rank_busy_us"] = e.rank_busy_us;
  d["rank_peak_bytes"] = e.rank_peak_bytes;
  d["rank_peak_in_flight"] = e.rank_peak_in_flight;
  nb::list timeline;
  for (const auto& order : e.timeline) {
    nb::list rank;
    for (const PipelineAction& a : order)
      rank.append(nb::make_tuple(std::string(1, a.kind), a.stage, a.microbatch, a.start_us, a.end_us));
    timeline.append(rank);
  }
  d["timeline"] = timeline;
  return d;
}

nb::dict price(const std::string& schedule, int ranks, int microbatches, const std::vector<nb::dict>& stages,
               double p2p_bytes_per_s, double p2p_latency_us, const std::vector<double>& reduction_us,
               const nb::object& links) {
  PipelineSpec spec;
  spec.schedule = parse_pipeline_schedule(schedule);
  spec.ranks = ranks;
  spec.microbatches = microbatches;
  spec.p2p_bytes_per_s = p2p_bytes_per_s;
  spec.p2p_latency_us = p2p_latency_us;
  spec.links = links_from(links);
  spec.reduction_us = reduction_us;
  std::vector<StageCost> costs;
  for (size_t i = 0; i < stages.size(); ++i) costs.push_back(stage_from(stages[i], i));
  return estimate_dict(spec, price_pipeline(spec, costs));
}

}  // namespace

void register_pipeline(nb::module_& m) {
  m.def("price_pipeline", &price, nb::arg("schedule"), nb::arg("ranks"), nb::arg("microbatches"), nb::arg("stages"),
        nb::arg("p2p_bytes_per_s"), nb::arg("p2p_latency_us"), nb::arg("reduction_us") = std::vector<double>{},
        nb::arg("links") = nb::none(),
        "Price one pipeline step: schedule \"GPipe\", \"1F1B\" or \"Interleaved1F1B\"; stages (ranks x "
        "stages-per-rank dicts of forward_us, backward_us per microbatch and saved_bytes, resident_bytes, "
        "send_bytes; stage s on rank s % ranks); links: None or one {bytes_per_s, latency_us} per rank "
        "(rank r -> r + 1). Returns step_us, makespan_us, bubble_fraction, per-rank busy time, peak bytes "
        "and peak microbatches in flight, and the timeline (per rank: (kind, stage, microbatch, start_us, "
        "end_us)). ValueError on bad input.");
  m.def("balanced_split", &balanced_split, nb::arg("layer_us"), nb::arg("stages"), nb::arg("first_extra_us") = 0.0,
        nb::arg("last_extra_us") = 0.0,
        "Each stage's first layer index of the contiguous split of the layers (times in us) into `stages` "
        "parts whose slowest part (the first adding first_extra_us, the last last_extra_us) is fastest.");
}

}  // namespace autoshard::bindings
