// Strategies in JSON: the reader of a node's explicit "strategies" field (docs/formats.md
// section 1: the rows of a user's sharding rule, written by the tracer; used by the graph
// reader), and the writer of an enumerated strategy (the Python rule tools' listing).
#pragma once

#include <string>
#include <vector>

#include "autoshard/graph.h"
#include "autoshard/strategy.h"
#include "io/json.h"

namespace autoshard {

// Rows of `j` (a JSON array) for node `n`, whose arguments are already resolved against `g`.
// Throws JsonError naming `at` (the node and its op) and what is wrong: a row whose number of
// output or input placements differs from the node's, a placement that does not parse, a
// Shard dim outside its tensor, a placement given for a None output.
std::vector<ShardingRow> read_explicit_strategies(const Json& j, const Graph& g, const Node& n, const std::string& at);

// {"inputs": [layout per tensor input], "outputs": [layout or null per output],
//  "compute_us": estimate}
Json strategy_to_json(const Strategy& s);

}  // namespace autoshard
