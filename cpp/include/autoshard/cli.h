// The `autoshard` command line. The same entry point serves the standalone executable and
// the Python console script (which handles `demo` itself and forwards the rest here).
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace autoshard {

// Runs `autoshard <subcommand> args...`; returns the process exit code. Never throws: every
// error is printed to `err` with what to do about it.
int cli_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// A subcommand: `args` excludes the program and subcommand names.
using SubcommandFn = std::function<int(const std::vector<std::string>& args, std::ostream& out, std::ostream& err)>;

struct Subcommand {
  std::string name;
  std::string summary;
  SubcommandFn run;
};

// Refuses, before any work is done, an output path that would destroy the input (the same
// file under any name) or that cannot be a file (a directory, a missing directory). `flag`
// names the option in the message. Throws std::invalid_argument.
void check_output_path(const std::string& input, const std::string& output, const std::string& flag);

// Each subcommand lives in its own file under cpp/src/cli and is listed in cli_main.cpp.
int cmd_solve(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
int cmd_plan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace autoshard
