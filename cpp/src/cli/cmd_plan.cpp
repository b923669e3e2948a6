// `autoshard plan`: placeholder until the planner lands (issue 2).
#include <ostream>

#include "autoshard/cli.h"

namespace autoshard {
int cmd_plan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  err << "autoshard plan: not implemented yet\n";
  return 2;
}
}  // namespace autoshard
