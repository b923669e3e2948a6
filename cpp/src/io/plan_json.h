// The plan file (docs/formats.md section 3) and the planner's text entry point: tensor graph
// JSON + options JSON -> plan JSON with a report (the Python API's _core.plan_graph).
#pragma once

#include <string>

#include "autoshard/plan.h"
#include "autoshard/planner.h"
#include "io/json.h"

namespace autoshard {

// The plan document without the "report" field.
Json plan_to_json(const ShardingModel& sm, const Plan& plan);

// The whole flow on a parsed graph; returns the plan document including "report".
Json plan_graph(const Graph& graph, const PlannerOptions& options);
// The same from texts; errors in either text start with "options: " or "graph: ".
std::string plan_graph_json(const std::string& graph_json, const std::string& options_json);

}  // namespace autoshard
