// Inputs that used to be read silently wrong or to crash (issue 11): byte-order marks and
// bytes that are not UTF-8, Infinity/NaN, directories and cut-off gzip files, costs the
// solver cannot hold exactly, and output paths that would overwrite the input. Each must
// be read correctly or refused with a message that names the cause.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "autoshard/cli.h"
#include "autoshard/exact.h"
#include "autoshard/problem_io.h"
#include "autoshard/solver.h"

#include "test_cli_run.h"
#include "test_data_paths.h"
#include "test_planner_util.h"
#include "io/json.h"
#include "io/problem_json.h"
#include "io/read_file.h"

using namespace autoshard;
namespace fs = std::filesystem;

namespace {

const char* kTiny =
    R"({"problem": {"nodes": {"costs": [[1, 2], [3, 1]], "usages": [[1, 1], [1, 1]], "intervals": [[0, 1], [0, 1]]},)"
    R"( "edges": {"nodes": [[0, 1]], "costs": [[0, 1, 1, 0]]}, "usage_limit": 10}})";

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "autoshard_inputs_" + name; }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

std::string gzip_bytes(const std::string& text) {
  const std::string path = temp_path("tmp.gz");
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path.c_str());
  return ss.str();
}

bool is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// One-edge problem with the given node costs (two nodes, one strategy on the second).
std::string two_node_problem(const std::string& costs0) {
  return R"({"problem": {"nodes": {"costs": [)" + costs0 +
         R"(, [0]]}, "edges": {"nodes": [[0, 1]], "costs": [[0, 0]]}}})";
}

}  // namespace

TEST(JsonInput, ByteOrderMarkIsSkipped) {
  Problem p = parse_problem(std::string("\xEF\xBB\xBF") + kTiny);
  EXPECT_EQ(p.num_nodes(), 2u);
}

TEST(JsonInput, BytesThatAreNotUtf8AreNamedInHexAndMessagesStayAscii) {
  std::string latin1 = kTiny;
  latin1.replace(latin1.find("problem"), 7, "probl\xE9m");
  std::string e = error_of([&] { parse_problem(latin1, "latin1.json"); });
  EXPECT_NE(e.find("byte 0xE9 in a string is not valid UTF-8"), std::string::npos) << e;
  EXPECT_TRUE(is_ascii(e)) << e;
  e = error_of([] { parse_json("{\"a\": 1 \xFF}"); });
  EXPECT_NE(e.find("found byte 0xFF (JSON text must be UTF-8)"), std::string::npos) << e;
  EXPECT_TRUE(is_ascii(e)) << e;
  e = error_of([] { parse_json("\xEF\xBB"); });  // half a byte-order mark
  EXPECT_NE(e.find("byte 0xEF"), std::string::npos) << e;
  // Valid multi-byte UTF-8 is kept as is; overlong forms and surrogates are not UTF-8.
  EXPECT_EQ(json_string(parse_json("\"gr\xC3\xBC\xC3\x9F\"")), "gr\xC3\xBC\xC3\x9F");
  EXPECT_NE(error_of([] { parse_json("\"\xC0\xAF\""); }), "");
  EXPECT_NE(error_of([] { parse_json("\"\xED\xA0\x80\""); }), "");
}

TEST(JsonInput, InfinityNamesTheFieldAndEmptyInputIsSaidToBeEmpty) {
  std::string e = error_of([] { parse_json(R"({"mesh": {"shape": [4]}, "time_limit_s": Infinity})"); });
  EXPECT_NE(e.find("the value of \"time_limit_s\": NaN and Infinity are not JSON numbers"), std::string::npos) << e;
  EXPECT_NE(error_of([] { parse_json("[-Infinity]"); }).find("not JSON numbers"), std::string::npos);
  EXPECT_NE(error_of([] { parse_json(" \n "); }).find("the input is empty"), std::string::npos);
}

TEST(FileInput, DirectoryAndTruncatedGzipAreRefused) {
  const std::string dir = temp_path("dir.json");
  fs::create_directories(dir);
  std::string e = error_of([&] { read_problem(dir); });
  EXPECT_NE(e.find("is a directory, not a file"), std::string::npos) << e;
  fs::remove(dir);

  const std::string gz = gzip_bytes(kTiny);
  const std::string whole = temp_path("whole.json.gz"), cut = temp_path("cut.json.gz");
  write_bytes(whole, gz);
  EXPECT_EQ(read_problem(whole).num_nodes(), 2u);
  for (size_t drop : {1u, 4u, 8u}) {
    write_bytes(cut, gz.substr(0, gz.size() - drop));
    e = error_of([&] { read_problem(cut); });
    EXPECT_NE(e.find("truncated or damaged gzip file"), std::string::npos) << drop << ": " << e;
  }
  std::remove(whole.c_str());
  std::remove(cut.c_str());
}

TEST(FileInput, ConcatenatedGzipMembersAreOneTextAndTrailingBytesAreDamage) {
  // `cat a.gz b.gz` is one gzip file of both texts, as gzip -d reads it; bytes after the last
  // member that are not gzip are damage, not the end; a damaged deflate stream is named.
  const std::string text = kTiny, half = text.substr(0, text.size() / 2);
  const std::string path = temp_path("members.json.gz");
  write_bytes(path, gzip_bytes(half) + gzip_bytes(text.substr(half.size())));
  EXPECT_EQ(read_file_maybe_gzip(path), text);
  EXPECT_EQ(read_problem(path).num_nodes(), 2u);
  write_bytes(path, gzip_bytes(text) + "junk");
  std::string e = error_of([&] { read_problem(path); });
  EXPECT_NE(e.find("truncated or damaged gzip file (bytes that are not gzip data follow its end"), std::string::npos)
      << e;
  write_bytes(path, std::string("\x1f\x8b") + "not deflate at all");
  e = error_of([&] { read_problem(path); });
  EXPECT_NE(e.find("is not a valid gzip file"), std::string::npos) << e;
  std::string flipped = gzip_bytes(text);
  flipped[flipped.size() - 6] ^= 0x55;  // in the CRC-32 of the trailer
  write_bytes(path, flipped);
  e = error_of([&] { read_problem(path); });
  EXPECT_NE(e.find("truncated or damaged gzip file (checksum mismatch"), std::string::npos) << e;
  std::remove(path.c_str());
}

TEST(FileInput, GzipReadAsItInflatesGivesTheWholeProblem) {
  // Over 8 MB of text: read_problem parses it while another thread inflates it chunk by
  // chunk (4 MB), and must build what parse_problem builds from the whole text.
  const int S = 1000;
  std::string text = R"({"problem": {"nodes": {"costs": [[)";
  for (int s = 0; s < S; ++s) text += (s ? ",1" : "1");
  text += "],[";
  for (int s = 0; s < S; ++s) text += (s ? ",2" : "2");
  text += R"(]]}, "edges": {"nodes": [[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]], "costs": [)";
  for (int e = 0; e < 5; ++e) {
    text += e ? ",[" : "[";
    for (int k = 0; k < S * S; ++k) {
      if (k) text += ',';
      text += char('0' + (k * 7 + e) % 10);
    }
    text += "]";
  }
  text += "]}}}";
  ASSERT_GT(text.size(), size_t(8) << 20);
  const Problem whole = parse_problem(text, "whole");
  const std::string gz = gzip_bytes(text), path = temp_path("big.json.gz");
  write_bytes(path, gz);
  const Problem streamed = read_problem(path);
  ASSERT_EQ(streamed.edges.size(), whole.edges.size());
  for (size_t e = 0; e < whole.edges.size(); ++e) EXPECT_EQ(streamed.edges[e].costs, whole.edges[e].costs) << e;
  EXPECT_EQ(streamed.node_costs, whole.node_costs);
  // Cut in the middle or just before the end: the reader names the damage, not a JSON error.
  for (size_t keep : {gz.size() / 2, gz.size() - 4}) {
    write_bytes(path, gz.substr(0, keep));
    const std::string e = error_of([&] { read_problem(path); });
    EXPECT_NE(e.find("truncated or damaged gzip file"), std::string::npos) << keep << ": " << e;
  }
  std::remove(path.c_str());
}

TEST(FileInput, TextAfterANulByteIsRefused) {
  // Both JSON readers take a NUL byte for the end of the text; a file with one after its
  // value is damaged, and must not be read as if it ended there.
  const std::string text = std::string(kTiny) + std::string("\0 [1]", 5);
  std::string e = error_of([&] { parse_problem(text, "nul.json"); });
  EXPECT_NE(e.find("a NUL byte after the JSON value"), std::string::npos) << e;
  const std::string path = temp_path("nul.json");
  write_bytes(path, text);
  e = error_of([&] { read_problem(path); });
  EXPECT_NE(e.find("a NUL byte after the JSON value"), std::string::npos) << e;
  std::remove(path.c_str());
}

TEST(ProblemCosts, EventAndTreeReadersRoundDecimalCostsAlike) {
  // Costs written with 17 significant digits, as the planner writes microseconds: both readers
  // must give the correctly rounded double, bit for bit.
  std::mt19937_64 rng(7);
  std::string costs = "[";
  for (int k = 0; k < 2000; ++k) {
    char buf[40];
    const double mantissa = std::uniform_real_distribution<double>(1.0, 10.0)(rng);
    std::snprintf(buf, sizeof buf, "%s%.16fe%d", k ? "," : "", mantissa, int(rng() % 30) - 15);
    costs += buf;
  }
  costs += "]";
  const std::string text =
      R"({"problem": {"nodes": {"costs": [)" + costs + R"(]}, "edges": {"nodes": [], "costs": []}}})";
  const Problem events = parse_problem(text, "events");
  const Problem tree = problem_from_json(parse_json(text), "tree");
  ASSERT_EQ(events.node_costs[0].size(), 2000u);
  for (size_t s = 0; s < 2000; ++s) EXPECT_EQ(events.node_costs[0][s], tree.node_costs[0][s]) << s;
}

TEST(ProblemCosts, CostsTheSolverCannotHoldExactlyAreRefused) {
  // 999999999999999999 used to round to 1e18 and be called infeasible.
  std::string e = error_of([] { parse_problem(two_node_problem("[999999999999999999, 5]"), "p.json"); });
  EXPECT_NE(e.find("problem.nodes.costs[0][0]: cost 999999999999999999 cannot be represented exactly"),
            std::string::npos)
      << e;
  // 1e17 and 1e17 + 1 used to compare equal.
  e = error_of([] { parse_problem(two_node_problem("[100000000000000001, 100000000000000000]")); });
  EXPECT_NE(e.find("cannot be represented exactly"), std::string::npos) << e;
  // Each cost fits, but a plan's sum could pass 2^53.
  e = error_of([] {
    parse_problem(R"({"problem": {"nodes": {"costs": [[5000000000000000, 1], [5000000000000000, 1]]},)"
                  R"( "edges": {"nodes": [[0, 1]], "costs": [[0, 0, 0, 0]]}}})");
  });
  EXPECT_NE(e.find("can add up to 1e+16"), std::string::npos) << e;
  // Infeasible markers (>= 1e18) and costs just below 2^53 are fine.
  Problem p = parse_problem(two_node_problem("[1000000000000000000, 9007199254740991]"));
  EXPECT_TRUE(is_infeasible(p.node_costs[0][0]));
  EXPECT_EQ(p.node_costs[0][1], 9007199254740991.0);
}

TEST(ProblemCosts, LargeIntegerCostsArePrintedAndOrderedExactly) {
  const std::string path = temp_path("exact.json");
  write_bytes(path, two_node_problem("[123456789012346, 123456789012345]"));
  CliRun r = run_cli({"solve", path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("cost: 123456789012345\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lower bound: 123456789012345\n"), std::string::npos) << r.out;
  std::remove(path.c_str());
}

// Large integer costs that differ by a few units: with a tolerance relative to the cost
// (1e-9 * 1e12 = 1000) the branch and bound pruned the better plans and still said
// "optimal". Checked against brute force.
TEST(ProblemCosts, ExactSearchSeparatesCostsOneUnitApartAtLargeMagnitude) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 rng(seed);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    Problem p;
    const int n = uni(5, 8);
    for (int i = 0; i < n; ++i) {
      p.node_costs.emplace_back();
      for (int s = 0, k = uni(2, 3); s < k; ++s) p.node_costs[i].push_back(1e12 + uni(0, 3));
    }
    // Dense (every pair joined), so reductions cannot solve it and the branch and bound must.
    for (int v = 1; v < n; ++v)
      for (int u = 0; u < v; ++u) {
        Edge e{u, v, {}};
        for (size_t x = 0; x < p.node_costs[u].size() * p.node_costs[v].size(); ++x)
          e.costs.push_back(1e11 + uni(0, 3));
        p.edges.push_back(std::move(e));
      }
    SolveOptions o;
    o.exact = true;
    o.time_limit_s = 5;
    SolveResult r = solve(p, o);
    SolveResult truth = solve_brute_force(p);
    ASSERT_TRUE(r.found);
    EXPECT_EQ(r.cost, truth.cost) << "seed " << seed;
    EXPECT_TRUE(r.proven_optimal);
  }
}

TEST(SolveTimeLimit, BadLimitsAreRefusedAndHugeOnesCapped) {
  EXPECT_NE(error_of([] {
              checked_time_limit(0, "--time-limit");
            }).find("--time-limit must be a finite number of seconds > 0, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { checked_time_limit(-1, "x"); }), "");
  EXPECT_NE(error_of([] { checked_time_limit(std::nan(""), "x"); }), "");
  EXPECT_NE(error_of([] { checked_time_limit(INFINITY, "x"); }), "");
  EXPECT_EQ(checked_time_limit(1e10, "x"), kMaxTimeLimitS);
  Problem p = parse_problem(kTiny);
  SolveOptions o;
  o.time_limit_s = std::nan("");
  EXPECT_NE(error_of([&] { solve(p, o); }).find("must be a finite number"), std::string::npos);
  o.time_limit_s = 1e10;  // used to overflow the clock: a deadline in the past
  SolveResult r = solve(p, o);
  EXPECT_TRUE(r.found);
  EXPECT_EQ(r.status, "optimal");
}

TEST(SolveCli, LimitsAndOutputPathsAreCheckedBeforeSolving) {
  const std::string path = temp_path("tiny.json");
  write_bytes(path, kTiny);
  for (const char* bad : {"0", "-1", "nan", "inf"}) {
    CliRun r = run_cli({"solve", path, "--time-limit", bad});
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_NE(r.err.find("--time-limit must be a finite number of seconds > 0"), std::string::npos) << r.err;
  }
  CliRun r = run_cli({"solve", path, "--out", path});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("would overwrite the input"), std::string::npos) << r.err;
  EXPECT_EQ(parse_problem(read_file_maybe_gzip(path)).num_nodes(), 2u);  // untouched
  r = run_cli({"solve", path, "--out", ::testing::TempDir()});
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  r = run_cli({"solve", path, "--out", temp_path("no/such/dir/sol.json")});
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

TEST(SolveCli, RunningOutOfTimeIsNotCalledInfeasible) {
  // A problem whose only plans break the memory limit: proven infeasible.
  const std::string path = temp_path("infeasible.json");
  std::string text = kTiny;
  text.replace(text.find("\"usage_limit\": 10"), 17, "\"usage_limit\": 1");
  write_bytes(path, text);
  CliRun r = run_cli({"solve", path});
  EXPECT_EQ(r.rc, 3);
  EXPECT_NE(r.err.find("none exists (proven"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("raise --time-limit"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

TEST(SolveCli, TimeRunningOutBeforeAnyPlanSaysSoAndSuggestsMoreTime) {
  AUTOSHARD_REQUIRE_INSTANCE(path, "B.json.gz");
  CliRun r = run_cli({"solve", path, "--time-limit", "0.01"});  // reading alone takes longer
  EXPECT_EQ(r.rc, 3);
  EXPECT_NE(r.out.find("infeasibility not proven"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("the time limit (0.01 s) ran out first and infeasibility was not proven; raise --time-limit"),
            std::string::npos)
      << r.err;
}
