// Runs the `autoshard` command in-process (cli_main) and keeps its exit code and output, for
// tests of what a user of the command sees.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "autoshard/cli.h"

struct CliRun {
  int rc;
  std::string out, err;
};

inline CliRun run_cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int rc = autoshard::cli_main(args, out, err);
  return {rc, out.str(), err.str()};
}
