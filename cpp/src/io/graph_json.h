// The tensor graph JSON (docs/formats.md section 1) read into the graph IR (graph.h).
#pragma once

#include <string>
#include <string_view>

#include "autoshard/graph.h"
#include "io/json.h"

namespace autoshard {

// Throws JsonError naming the node and field on bad input.
Graph parse_graph(const Json& doc);
Graph parse_graph_text(std::string_view text);
// Reads PATH (plain or gzip); errors start with the path.
Graph read_graph_file(const std::string& path);

}  // namespace autoshard
