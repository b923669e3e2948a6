// dtype names and sizes, checked against torch 2.13's dtype table (torch.<name>.itemsize).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "autoshard/cost_model.h"

using namespace autoshard;

TEST(CostDType, ParsesEveryTorchNameWithItsItemsize) {
  // (name, itemsize) as printed by {n: getattr(torch, n).itemsize} in torch 2.13.
  const std::vector<std::pair<std::string, int>> torch_table = {{"float32", 4},
                                                                {"float", 4},
                                                                {"float64", 8},
                                                                {"double", 8},
                                                                {"bfloat16", 2},
                                                                {"float16", 2},
                                                                {"half", 2},
                                                                {"int64", 8},
                                                                {"long", 8},
                                                                {"int32", 4},
                                                                {"int", 4},
                                                                {"int16", 2},
                                                                {"short", 2},
                                                                {"int8", 1},
                                                                {"uint8", 1},
                                                                {"bool", 1},
                                                                {"complex64", 8},
                                                                {"cfloat", 8},
                                                                {"complex128", 16},
                                                                {"cdouble", 16},
                                                                {"complex32", 4},
                                                                {"chalf", 4},
                                                                {"float8_e4m3fn", 1},
                                                                {"float8_e5m2", 1},
                                                                {"float8_e4m3fnuz", 1},
                                                                {"float8_e5m2fnuz", 1},
                                                                {"float8_e8m0fnu", 1},
                                                                {"float4_e2m1fn_x2", 1},
                                                                {"uint16", 2},
                                                                {"uint32", 4},
                                                                {"uint64", 8}};
  for (const auto& [name, size] : torch_table) {
    SCOPED_TRACE(name);
    EXPECT_EQ(dtype_bytes(parse_dtype(name)), size);
    EXPECT_EQ(parse_dtype("torch." + name), parse_dtype(name));
  }
}

TEST(CostDType, AliasesMapToTheCanonicalDType) {
  EXPECT_EQ(parse_dtype("float"), DType::Float32);
  EXPECT_EQ(parse_dtype("half"), DType::Float16);
  EXPECT_EQ(parse_dtype("long"), DType::Int64);
  EXPECT_EQ(parse_dtype("int"), DType::Int32);
  EXPECT_EQ(parse_dtype("double"), DType::Float64);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::Float8);
  EXPECT_EQ(dtype_name(DType::Float8), "float8_e4m3fn");
  EXPECT_EQ(dtype_name(parse_dtype("half")), "float16");
}

TEST(CostDType, NamesRoundTripForEveryEnumerator) {
  for (int i = 0; i <= static_cast<int>(DType::UInt64); ++i) {
    DType d = static_cast<DType>(i);
    EXPECT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
  }
}

TEST(CostDType, UnknownNameThrowsNamingTheValue) {
  for (std::string bad : {"float33", "qint8", "", "Float32", "torch.", "int4"}) {
    try {
      parse_dtype(bad);
      FAIL() << "expected invalid_argument for '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << "lists the known names";
    }
  }
}

TEST(CostDType, Classification) {
  EXPECT_TRUE(dtype_is_floating(DType::BFloat16));
  EXPECT_TRUE(dtype_is_floating(DType::Float8E5M2));
  EXPECT_FALSE(dtype_is_floating(DType::Int64));
  EXPECT_FALSE(dtype_is_floating(DType::Bool));
  EXPECT_FALSE(dtype_is_floating(DType::Complex64));
  EXPECT_TRUE(dtype_is_complex(DType::Complex64));
  EXPECT_FALSE(dtype_is_complex(DType::Float32));
}
