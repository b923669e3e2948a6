// `autoshard solve`: placeholder until the solver lands (issue 3).
#include <ostream>

#include "autoshard/cli.h"

namespace autoshard {
int cmd_solve(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  err << "autoshard solve: not implemented yet\n";
  return 2;
}
}  // namespace autoshard
