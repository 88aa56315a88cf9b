// Element types of tensors on disk and on the wire, with the half-precision
// conversions the CPU paths need.
#ifndef E3_COMMON_DTYPE_H_
#define E3_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace e3 {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "BF16", "I64", "BOOL", ...
std::string_view DTypeName(DType dtype);
// Parses a safetensors dtype string; unknown strings are an error naming them.
absl::StatusOr<DType> ParseDType(std::string_view name);
// Parses user-facing names: "float32"/"fp32", "bfloat16"/"bf16", "float16"/"fp16".
absl::StatusOr<DType> ParseComputeDType(std::string_view name);

float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);  // round to nearest even, NaN kept
float F16ToFloat(uint16_t bits);
uint16_t FloatToF16(float value);  // round to nearest even

}  // namespace e3

#endif  // E3_COMMON_DTYPE_H_
