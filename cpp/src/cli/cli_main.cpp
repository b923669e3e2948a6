// Dispatch of `autoshard <subcommand>`.
#include <exception>
#include <filesystem>
#include <ostream>
#include <stdexcept>

#include "autoshard/cli.h"

namespace autoshard {

static const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> list = {
      {"solve", "solve a solver problem (IOPDDL JSON, optionally gzip): autoshard solve PROBLEM.json[.gz]", cmd_solve},
      {"plan", "plan a traced tensor graph on a device mesh: autoshard plan GRAPH.json --mesh 8x8", cmd_plan},
  };
  return list;
}

static void usage(std::ostream& os) {
  os << "usage: autoshard <command> [options]\n\ncommands:\n";
  for (const auto& s : subcommands()) os << "  " << s.name << "\t" << s.summary << "\n";
  os << "  demo\tplan Llama-3-8B on a virtual 64-GPU mesh and show the plan (Python front end)\n";
  os << "\nRun 'autoshard <command> --help' for the options of a command.\n";
}

void check_output_path(const std::string& input, const std::string& output, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path out(output);
  if (fs::is_directory(out, ec))
    throw std::invalid_argument(flag + " '" + output + "' is a directory; give a file path inside it");
  if (fs::exists(out, ec) && fs::equivalent(fs::path(input), out, ec))
    throw std::invalid_argument(flag + " '" + output + "' is the input file '" + input +
                                "'; writing there would overwrite the input: give another path");
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw std::invalid_argument(flag + " '" + output + "': the directory '" + dir.string() +
                                "' does not exist; create it or give another path");
}

int cli_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    usage(args.empty() ? err : out);
    return args.empty() ? 2 : 0;
  }
  for (const auto& s : subcommands()) {
    if (s.name != args[0]) continue;
    try {
      return s.run(std::vector<std::string>(args.begin() + 1, args.end()), out, err);
    } catch (const std::exception& e) {
      err << "autoshard " << s.name << ": error: " << e.what() << "\n";
      return 1;
    }
  }
  err << "autoshard: unknown command '" << args[0] << "'\n";
  usage(err);
  return 2;
}

}  // namespace autoshard
