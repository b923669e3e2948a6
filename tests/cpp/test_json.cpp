#include <gtest/gtest.h>

#include "autoshard/json.h"

using namespace autoshard;

TEST(Json, ParsesNestedDocument) {
  Json j = parse_json(R"({"a": [1, -2, 3.5, true, null], "b": {"c": "x\ny"}})");
  ASSERT_TRUE(j.is_object());
  const auto& a = j.at("a").as_array();
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[0].as_int(), 1);
  EXPECT_EQ(a[1].as_int(), -2);
  EXPECT_DOUBLE_EQ(a[2].as_double(), 3.5);
  EXPECT_TRUE(a[3].as_bool());
  EXPECT_TRUE(a[4].is_null());
  EXPECT_EQ(j.at("b").at("c").as_string(), "x\ny");
}

TEST(Json, KeepsLargeIntegersExact) {
  Json j = parse_json("[1000000000000000000, 9007199254740993]");
  EXPECT_EQ(j.as_array()[0].as_int(), 1000000000000000000LL);
  EXPECT_EQ(j.as_array()[1].as_int(), 9007199254740993LL);
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
    j.at("n").as_int("problem.n");
    FAIL();
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("problem.n"), std::string::npos);
  }
}
