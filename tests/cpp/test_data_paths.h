// Where the tests find their data: the small files in tests/cpp/data (test_data), and the
// public IOPDDL instances: $AUTOSHARD_IOPDDL_DIR, else the shared/
// folder beside the checkout (../shared/bench/iopddl). Tests that need one skip when the
// instances are not on this machine rather than fail for a reason unrelated to the code.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

inline std::string test_data(const char* name) { return std::string(AUTOSHARD_SOURCE_DIR) + "/tests/cpp/data/" + name; }

inline std::string iopddl_instance(const std::string& file) {
  namespace fs = std::filesystem;
  if (const char* dir = std::getenv("AUTOSHARD_IOPDDL_DIR")) {
    fs::path p = fs::path(dir) / file;
    if (fs::exists(p)) return p.string();
  }
  for (fs::path base : {fs::path(AUTOSHARD_SOURCE_DIR) / ".." / "shared", fs::path("/work/shared")}) {
    fs::path p = base / "bench" / "iopddl" / file;
    if (fs::exists(p)) return fs::weakly_canonical(p).string();
  }
  return "";
}

#define AUTOSHARD_REQUIRE_INSTANCE(var, file)                   \
  const std::string var = iopddl_instance(file);                \
  if (var.empty())                                              \
    GTEST_SKIP() << "IOPDDL instance " << file << " not found " \
                 << "(set AUTOSHARD_IOPDDL_DIR)";
