// Human-readable explanation of a plan: a summary, a per-module (per-layer) table with the
// placement of each weight and main activation, comm vs compute time and parameter memory,
// and (verbose) one line per node.
#pragma once

#include <string>

#include "autoshard/plan.h"

namespace autoshard {

std::string plan_report(const ShardingModel& sm, const Plan& plan, bool verbose);

// The module group a node is reported under: its `module` path cut after a numbered
// component ("layers.3.attention.wq" -> "layers.3"), "(params/inputs)" for placeholders
// without a module, "(other)" otherwise.
std::string module_group(const std::string& module);

}  // namespace autoshard
