// Input checks of price_pipeline: each failure is a std::invalid_argument naming the value,
// so a Python caller gets a ValueError that says what to change.
#pragma once

#include <vector>

#include "autoshard/pipeline.h"

namespace autoshard::pipeline_detail {

// Checks the spec and the stages; returns the stages per rank.
int check_pipeline_input(const PipelineSpec& spec, const std::vector<StageCost>& stages);

}  // namespace autoshard::pipeline_detail
