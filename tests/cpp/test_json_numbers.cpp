// The in-place number scanner of the event reader (io/json_numbers.h): every number it takes
// has the value strtod gives (the document reader's), and every text it does not take whole
// is left to RapidJSON's reader or refused, never read differently.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "io/json_events.h"
#include "io/json_numbers.h"

namespace autoshard::detail {
namespace {

ScannedNumber scan(const std::string& text) {
  ScannedNumber n;
  scan_json_number(text, 40, n);
  return n;
}

// The same double, bit for bit (-0.0 is not 0.0 here).
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(JsonNumbers, IntegersAreExactUpToTheLargestInt64) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"0", 0},
      {"-0", 0},
      {"7,", 7},
      {"-42]", -42},
      {"12345678", 12345678},
      {"123456789", 123456789},
      {"1000000000000000000", 1000000000000000000},
      {"9223372036854775807", 9223372036854775807},
      {"-9223372036854775807 ", -9223372036854775807},
  };
  for (const auto& [text, value] : cases) {
    SCOPED_TRACE(text);
    const ScannedNumber n = scan(text);
    ASSERT_EQ(int(n.kind), int(ScannedNumber::Integer));
    EXPECT_EQ(n.integer, value);
    const size_t end = text.find_first_of(",] ");
    EXPECT_EQ(n.length, end == std::string::npos ? text.size() : end);
  }
}

TEST(JsonNumbers, WhatItDoesNotTakeGoesToTheReader) {
  // Out of int64 (RapidJSON passes them as Uint64 or Double), beyond a double's range, or
  // longer than the window: RapidJSON reads them.
  for (const char* text :
       {"9223372036854775808", "-9223372036854775808", "12345678901234567890", "1e400", "-1e400",
        "1.0000000000000000000000000000000000000000000001", "100000000000000000000000000000000000000000000"}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(int(scan(text).kind), int(ScannedNumber::Reader));
  }
}

TEST(JsonNumbers, TextThatIsNotAJsonNumberIsRefused) {
  for (const char* text : {"-", "-x", "01", "-01", "00", "1.", "1.e5", "1e", "1e+", "1E-", "1-2", "1.5.5", "1e5e5",
                           "1+", "2.5-", "1ee2", "1..2"}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(int(scan(text).kind), int(ScannedNumber::Invalid));
  }
}

TEST(JsonNumbers, RealsAreRoundedAsStrtodRoundsThem) {
  std::vector<std::string> texts = {"1.5",
                                    "-0.0",
                                    "3e2",
                                    "1E-2",
                                    "2.5e+3",
                                    "984.5072238805969",
                                    "61.62340298507462",
                                    "0.30000000000000004",
                                    "9007199254740993.0",
                                    "1e22",
                                    "1e23",
                                    "4.9e-324",
                                    "2.2250738585072011e-308",
                                    "123456789012345678901234.5",
                                    "0.1e-5"};
  // Random doubles written shortest (%.17g) and at fewer digits, and random digit strings:
  // both the fast path (up to 2^53, powers of ten to 10^22) and std::from_chars are met.
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<double> mant(-1e6, 1e6);
  std::uniform_int_distribution<int> exp10(-30, 30), digits(1, 17), len(1, 12);
  char buf[64];
  for (int i = 0; i < 20000; ++i) {
    const double d = mant(rng) * std::pow(10.0, exp10(rng));
    std::snprintf(buf, sizeof buf, "%.*g", digits(rng), d);
    std::string t = buf;
    if (t.find_first_of(".e") == std::string::npos) t += ".0";
    texts.push_back(t);
    std::string r = std::to_string(rng() % 100000) + ".";
    for (int k = len(rng); k > 0; --k) r += static_cast<char>('0' + rng() % 10);
    texts.push_back(r);
  }
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    const ScannedNumber n = scan(text);
    ASSERT_EQ(int(n.kind), int(ScannedNumber::Real));
    EXPECT_EQ(n.length, text.size());
    EXPECT_TRUE(same_bits(n.real, std::strtod(text.c_str(), nullptr))) << n.real;
  }
}

// Records what json_numbers hands over, and what the reader's events then add.
struct Recorder {
  std::vector<std::string> seen;
  bool Null() { return false; }
  bool Bool(bool) { return false; }
  bool Int(int v) { return add("i" + std::to_string(v)); }
  bool Uint(unsigned v) { return add("i" + std::to_string(v)); }
  bool Int64(int64_t v) { return add("i" + std::to_string(v)); }
  bool Uint64(uint64_t v) { return add("u" + std::to_string(v)); }
  bool Double(double d) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "d%.17g", d);
    return add(buf);
  }
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return false; }
  bool String(const char* s, rapidjson::SizeType n, bool) { return add("s" + std::string(s, n)); }
  bool StartObject() { return false; }
  bool Key(const char*, rapidjson::SizeType, bool) { return false; }
  bool EndObject(rapidjson::SizeType) { return false; }
  // Arrays of numbers (one level; a nested array is refused) through the scanner.
  bool StartArray() {
    if (++depth > 1) return false;
    return json_numbers(*input, *this);
  }
  bool EndArray(rapidjson::SizeType) {
    --depth;
    return add("]");
  }
  bool add(std::string s) {
    seen.push_back(std::move(s));
    return true;
  }
  JsonInput* input = nullptr;
  int depth = 0;
};

// The events read from `input` (an array), or "refused".
std::string events(JsonInput& input) {
  Recorder r;
  r.input = &input;
  if (!json_events(input, r)) return "refused";
  std::string out;
  for (const std::string& s : r.seen) out += (out.empty() ? "" : " ") + s;
  return out;
}

std::string events(const std::string& text) {
  JsonInput input(text);
  return events(input);
}

TEST(JsonNumbers, ArraysReadAsTheReaderReadsThem) {
  EXPECT_EQ(events("[]"), "]");
  EXPECT_EQ(events(" [ ] "), "]");
  EXPECT_EQ(events("[1,2.5,-3]"), "i1 d2.5 i-3 ]");
  EXPECT_EQ(events("[ 1 ,\n\t2 ,\r\n -0.5e1 ]"), "i1 i2 d-5 ]");
  // The reader takes over at a number the scanner leaves, and reads the rest of the array.
  EXPECT_EQ(events("[1, 18446744073709551615, 2]"), "i1 u18446744073709551615 i2 ]");
  EXPECT_EQ(events("[9223372036854775808, 2]"), "u9223372036854775808 i2 ]");
  EXPECT_EQ(events("[1, 1.000000000000000000000000000000000000000000001, 2]"), "i1 d1 i2 ]");
  // A first element that is not a number goes to the handler.
  EXPECT_EQ(events(R"(["a", 1])"), "sa i1 ]");
  // Malformed arrays and numbers are refused wherever they are.
  for (const char* bad : {"[1 2]", "[1,]", "[,1]", "[1,,2]", "[01]", "[1.]", "[-]", "[1x]", "[1, [2]]", "[1, \"a\"]",
                          "[1", "[1,", "[1.5e]", "[1, -]", "[1]x", "[1, 2 3]", "[1,\n]"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(events(bad), "refused");
  }
}

TEST(JsonNumbers, AStreamReadsAsTheTextAcrossItsBlocks) {
  // Over 64 KB (the stream's block) of numbers of every length, white space between: numbers
  // cut by a block's end must read whole.
  std::mt19937_64 rng(5);
  std::string text = "[";
  for (int i = 0; i < 30000; ++i) {
    if (i) text += std::string(rng() % 3, ' ') + ",";
    switch (rng() % 4) {
      case 0:
        text += (rng() % 2 ? "-" : "") + std::to_string(rng() >> (1 + rng() % 63));
        break;
      case 1:
        text += std::to_string(rng() % 1000) + "." + std::to_string(rng());
        break;
      case 2:
        text += std::to_string(rng() % 10) + "e" + std::to_string(static_cast<int>(rng() % 40) - 20);
        break;
      default:
        text += "1000000000000000000";
    }
  }
  text += "]";
  ASSERT_GT(text.size(), size_t(3) << 16);
  const std::string from_text = events(text);
  ASSERT_NE(from_text, "refused");
  std::istringstream in(text);
  JsonInput input(*in.rdbuf());
  EXPECT_EQ(events(input), from_text);
}

}  // namespace
}  // namespace autoshard::detail
