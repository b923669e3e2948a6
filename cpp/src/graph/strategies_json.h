// Reader of a node's explicit "strategies" field (docs/formats.md section 1): the rows of a
// user's sharding rule, written by the tracer. Private to cpp/src/graph.
#pragma once

#include <string>
#include <vector>

#include "autoshard/graph.h"

namespace autoshard {

// Rows of `j` (a JSON array) for node `n`, whose arguments are already resolved against `g`.
// Throws JsonError naming `at` (the node and its op) and what is wrong: a row whose number of
// output or input placements differs from the node's, a placement that does not parse, a
// Shard dim outside its tensor, a placement given for a None output.
std::vector<ShardingRow> read_explicit_strategies(const Json& j, const Graph& g, const Node& n,
                                                  const std::string& at);

}  // namespace autoshard
