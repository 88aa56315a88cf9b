#include "common/model/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace e3 {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  static constexpr DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                                   DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                                   DType::kU8,  DType::kBool, DType::kF8E4M3};
  for (DType d : kAll) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported dtype \"", std::string(name),
      "\" (expected one of F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3)"));
}

absl::StatusOr<DType> ParseComputeDType(std::string_view name) {
  std::string n = absl::AsciiStrToLower(std::string(name));
  if (n == "float32" || n == "fp32" || n == "f32" || n == "float") return DType::kF32;
  if (n == "bfloat16" || n == "bf16") return DType::kBF16;
  if (n == "float16" || n == "fp16" || n == "f16" || n == "half") return DType::kF16;
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported compute dtype \"", std::string(name), "\" (expected float32, bfloat16 or float16)"));
}

float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToBf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | (exp + 127 - 15) << 23 | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToF16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (113 - e) - 1
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float Fp8E4M3ToFloat(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();  // the only NaNs; no infinities
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^(1-7)
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace e3
