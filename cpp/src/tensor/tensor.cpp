// Element types: torch names, aliases and sizes (torch.<dtype>.itemsize in torch 2.13); tensor sizes.
#include <array>
#include <stdexcept>
#include <string>

#include "autoshard/tensor.h"

namespace autoshard {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // canonical torch name
  int bytes;              // torch itemsize
};

// One row per enumerator, in enum order (checked by the tests through dtype_name round trips).
constexpr std::array<DTypeInfo, 22> kDTypes{{
    {DType::Float64, "float64", 8},
    {DType::Float32, "float32", 4},
    {DType::BFloat16, "bfloat16", 2},
    {DType::Float16, "float16", 2},
    {DType::Float8, "float8_e4m3fn", 1},
    {DType::Int64, "int64", 8},
    {DType::Int32, "int32", 4},
    {DType::Int16, "int16", 2},
    {DType::Int8, "int8", 1},
    {DType::UInt8, "uint8", 1},
    {DType::Bool, "bool", 1},
    {DType::Complex64, "complex64", 8},
    {DType::Float8E5M2, "float8_e5m2", 1},
    {DType::Float8E4M3FNUZ, "float8_e4m3fnuz", 1},
    {DType::Float8E5M2FNUZ, "float8_e5m2fnuz", 1},
    {DType::Float8E8M0FNU, "float8_e8m0fnu", 1},
    {DType::Float4E2M1FNx2, "float4_e2m1fn_x2", 1},  // two fp4 values per byte
    {DType::Complex32, "complex32", 4},
    {DType::Complex128, "complex128", 16},
    {DType::UInt16, "uint16", 2},
    {DType::UInt32, "uint32", 4},
    {DType::UInt64, "uint64", 8},
}};

// torch's alternative names for the same dtype objects (torch.float is torch.float32, ...).
struct Alias {
  std::string_view alias;
  DType dtype;
};
constexpr std::array<Alias, 9> kAliases{{
    {"float", DType::Float32},
    {"double", DType::Float64},
    {"half", DType::Float16},
    {"long", DType::Int64},
    {"int", DType::Int32},
    {"short", DType::Int16},
    {"cfloat", DType::Complex64},
    {"cdouble", DType::Complex128},
    {"chalf", DType::Complex32},
}};

const DTypeInfo& info(DType d) {
  auto i = static_cast<size_t>(d);
  if (i >= kDTypes.size() || kDTypes[i].dtype != d)
    throw std::logic_error("dtype table out of order for enumerator " + std::to_string(i));
  return kDTypes[i];
}

}  // namespace

DType parse_dtype(std::string_view name) {
  std::string_view bare = name;
  if (bare.substr(0, 6) == "torch.") bare.remove_prefix(6);
  for (const auto& row : kDTypes)
    if (row.name == bare) return row.dtype;
  for (const auto& a : kAliases)
    if (a.alias == bare) return a.dtype;
  std::string known;
  for (const auto& row : kDTypes) known += (known.empty() ? "" : ", ") + std::string(row.name);
  throw std::invalid_argument("unknown dtype '" + std::string(name) + "'; expected a torch dtype name: " + known +
                              " (or an alias: float, double, half, long, int, short, cfloat, "
                              "cdouble, chalf)");
}

std::string_view dtype_name(DType d) { return info(d).name; }

int dtype_bytes(DType d) { return info(d).bytes; }

bool dtype_is_floating(DType d) {
  switch (d) {
    case DType::Float64:
    case DType::Float32:
    case DType::BFloat16:
    case DType::Float16:
    case DType::Float8:
    case DType::Float8E5M2:
    case DType::Float8E4M3FNUZ:
    case DType::Float8E5M2FNUZ:
    case DType::Float8E8M0FNU:
    case DType::Float4E2M1FNx2:
      return true;
    default:
      return false;
  }
}

bool dtype_is_complex(DType d) { return d == DType::Complex32 || d == DType::Complex64 || d == DType::Complex128; }

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}
int64_t TensorMeta::bytes() const { return numel() * dtype_bytes(dtype); }

}  // namespace autoshard
