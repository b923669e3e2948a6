// Whole-file reading for every input format (graph, plan, options, problem files).
#pragma once

#include <istream>
#include <memory>
#include <string>

namespace autoshard {

// Reads a file (gzip-compressed when it starts with the gzip magic) into memory. Throws
// std::runtime_error naming the path for a directory, a missing file and a cut-off or damaged
// gzip stream.
std::string read_file_maybe_gzip(const std::string& path);

// The same text as a stream, for readers that parse as it arrives. A gzip file is inflated on
// a second thread a few MB ahead of the reader, so parsing overlaps inflating (1.5 GB planner
// problems: 3.8 s of inflating beside 5 s of reading) and the whole text is never held. The
// same errors as above: thrown here for a directory or a missing file, and by the stream's
// reads (std::runtime_error, out of the parser) for a cut-off or damaged gzip stream.
std::unique_ptr<std::istream> open_text_stream(const std::string& path);

}  // namespace autoshard
