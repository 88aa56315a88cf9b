// Element types of tensors on disk and on the wire, with the half-precision
// conversions the CPU paths need.
#ifndef E3_COMMON_MODEL_DTYPE_H_
#define E3_COMMON_MODEL_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace e3 {

// kF8E4M3 is float8_e4m3fn, as FP8 checkpoints store weights (safetensors
// "F8_E4M3"); it is read from disk only, never sent on the wire.
enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3 };

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
// float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
// infinities, 0x7f and 0xff are NaN; largest finite 448), exactly.
float Fp8E4M3ToFloat(uint8_t bits);

}  // namespace e3

#endif  // E3_COMMON_MODEL_DTYPE_H_
