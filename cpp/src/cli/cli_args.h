// What the subcommands share for reading their arguments: CLI11 does the parsing, these turn
// its outcome and the option texts into autoshard's messages (the option named, the value
// quoted, what to give instead).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace autoshard::cli {

// A command line that cannot be run as given; the subcommand prints it with its usage and
// exits with 2.
struct UsageError {
  std::string message;
};

// A parser for `autoshard NAME`, with option values kept as given (texts, converted by the
// functions below so every message names the option), a repeated option's last value taken,
// and unknown arguments left to `reject_extras`.
void configure(CLI::App& app);

// Parses `args` (without the program and subcommand names). Returns false when help was asked
// for; throws UsageError for a missing value and the like.
bool parse(CLI::App& app, const std::vector<std::string>& args);

// Arguments CLI11 did not take: the first unknown option, or a second positional argument
// (`what` names it: "problem file"), is a UsageError.
void reject_extras(const CLI::App& app, const std::string& first_positional, const std::string& what);

// Whole-string numbers only ("4e9" is fine, "4GB" or "" is not); inf and nan pass here and
// are judged by the option that reads them. Throws std::invalid_argument
// "<option> expects <noun>, got '<text>'".
double to_double(const std::string& text, const std::string& option, const std::string& noun = "a number");
int64_t to_int(const std::string& text, const std::string& option);

}  // namespace autoshard::cli
