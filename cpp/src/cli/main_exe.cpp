// The standalone `autoshard-cli` executable (the pip-installed `autoshard` script forwards
// to the same cli_main through the extension module).
#include <iostream>

#include "autoshard/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return autoshard::cli_main(args, std::cout, std::cerr);
}
