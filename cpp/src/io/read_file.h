// Whole-file reading for every input format (graph, plan, options, problem files).
#pragma once

#include <string>

namespace autoshard {

// Reads a file (gzip-compressed when it starts with the gzip magic) into memory. Throws
// std::runtime_error naming the path for a directory, a missing file and a cut-off or damaged
// gzip stream.
std::string read_file_maybe_gzip(const std::string& path);

}  // namespace autoshard
