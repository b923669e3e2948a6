// What a traced tensor is, apart from where it lives: its element type and its shape.
// (Below every stage: placement, graph and cost all speak of tensors.)
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace autoshard {

// Element types of traced tensors. Float8 is torch.float8_e4m3fn; the other float8 / float4
// variants, complex32/128 and the wide unsigned types are appended so names round-trip.
enum class DType {
  Float64,
  Float32,
  BFloat16,
  Float16,
  Float8,
  Int64,
  Int32,
  Int16,
  Int8,
  UInt8,
  Bool,
  Complex64,
  Float8E5M2,
  Float8E4M3FNUZ,
  Float8E5M2FNUZ,
  Float8E8M0FNU,
  Float4E2M1FNx2,
  Complex32,
  Complex128,
  UInt16,
  UInt32,
  UInt64
};
// Accepts the torch names and aliases ("float32", "float", "half", "long", "cfloat", ...), with
// or without a "torch." prefix; throws std::invalid_argument naming the value otherwise.
DType parse_dtype(std::string_view name);
std::string_view dtype_name(DType d);  // canonical torch name: "float32", "float8_e4m3fn"
int dtype_bytes(DType d);              // torch itemsize (float4_e2m1fn_x2 packs 2 -> 1 byte)
bool dtype_is_floating(DType d);       // real floating point (float8..float64)
bool dtype_is_complex(DType d);

struct TensorMeta {
  std::vector<int64_t> shape;
  DType dtype = DType::Float32;
  int64_t numel() const;
  int64_t bytes() const;
  int rank() const { return static_cast<int>(shape.size()); }
};

}  // namespace autoshard
