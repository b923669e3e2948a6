#include <gtest/gtest.h>

#include "io/json.h"

using namespace autoshard;

TEST(Json, ParsesNestedDocument) {
  Json j = parse_json(R"({"a": [1, -2, 3.5, true, null], "b": {"c": "x\ny"}})");
  ASSERT_TRUE(j.is_object());
  const auto& a = json_array(j.at("a"));
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(json_int(a[0]), 1);
  EXPECT_EQ(json_int(a[1]), -2);
  EXPECT_DOUBLE_EQ(json_double(a[2]), 3.5);
  EXPECT_TRUE(json_bool(a[3]));
  EXPECT_TRUE(a[4].is_null());
  EXPECT_EQ(json_string(j.at("b").at("c")), "x\ny");
}

TEST(Json, KeepsLargeIntegersExact) {
  Json j = parse_json("[1000000000000000000, 9007199254740993]");
  EXPECT_EQ(json_int(json_array(j)[0]), 1000000000000000000LL);
  EXPECT_EQ(json_int(json_array(j)[1]), 9007199254740993LL);
}

TEST(Json, ErrorNamesLineAndColumn) {
  try {
    parse_json("{\n  \"a\": [1, 2,\n  }");
    FAIL() << "expected a JsonError";
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

TEST(Json, RejectsTrailingGarbageAndBadTokens) {
  EXPECT_THROW(parse_json("[1] x"), JsonError);
  EXPECT_THROW(parse_json("[01x]"), JsonError);
  EXPECT_THROW(parse_json("{\"a\" 1}"), JsonError);
  EXPECT_THROW(parse_json("\"unterminated"), JsonError);
}

TEST(Json, RoundTripsThroughDump) {
  std::string text = R"({"k":[1,2.5,"s",false,null,{"z":-7}]})";
  EXPECT_EQ(parse_json(text).dump(), text);
}

TEST(Json, TypeErrorsNameThePlace) {
  Json j = parse_json(R"({"n": "x"})");
  try {
    json_int(j.at("n"), "problem.n");
    FAIL();
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("problem.n"), std::string::npos);
  }
}

TEST(Json, IntegralNumbersAreWrittenAsIntegersAndOthersReadBackExactly) {
  EXPECT_EQ(dump_json(json_number(12.0)), "12");
  EXPECT_EQ(dump_json(json_number(0.1)), "0.1");
  EXPECT_EQ(json_double(parse_json(dump_json(json_number(1.0 / 3.0)))), 1.0 / 3.0);
  EXPECT_EQ(dump_json(json_number(1.0 / 0.0)), "1e+308");
}

TEST(Json, NestingDeeperThan512LevelsIsRefused) {
  const std::string deep = std::string(600, '[') + std::string(600, ']');
  try {
    parse_json(deep);
    FAIL() << "expected a JsonError";
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("nesting deeper than 512 levels"), std::string::npos) << e.what();
  }
}
