#include "common/model/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace e3 {
namespace {

TEST(DTypeTest, ParsesSafetensorsNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseDType("BF16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("BOOL"), DType::kBool);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(*ParseDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  auto bad = ParseDType("F8_E5M2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("F8_E5M2"), std::string::npos);
  EXPECT_EQ(*ParseComputeDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseComputeDType("FP32"), DType::kF32);
  EXPECT_FALSE(ParseComputeDType("int8").ok());
}

// Every one of the 256 codes against the format's definition, written out
// independently: value = (-1)^s * 2^(e-7) * (1 + m/8), subnormals
// 2^-6 * m/8, and the two NaN codes.
TEST(DTypeTest, Fp8E4M3DecodesEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    const float got = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    double want = e == 0 ? std::pow(2.0, -6) * m / 8.0 : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
    if (s) want = -want;
    EXPECT_EQ(static_cast<double>(got), want) << "code " << code;
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0xc0), -2.0f);
  EXPECT_TRUE(std::signbit(Fp8E4M3ToFloat(0x80)));  // -0
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
  EXPECT_FALSE(std::isinf(Fp8E4M3ToFloat(0x78)));  // 0x78 is 256, not infinity as in e5m2/IEEE
  EXPECT_EQ(Fp8E4M3ToFloat(0x78), 256.0f);
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // Slightly above the halfway point rounds up.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-std::numeric_limits<float>::infinity())),
            -std::numeric_limits<float>::infinity());
}

TEST(DTypeTest, F16ConvertsNormalsSubnormalsAndSpecials) {
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);             // largest normal
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToF16(1e6f), 0x7c00);                 // overflow to inf
  EXPECT_EQ(FloatToF16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(std::numeric_limits<float>::quiet_NaN()))));
  // Every f16 bit pattern survives f16 -> f32 -> f16.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float f = F16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToF16(f), bits) << std::hex << bits;
  }
}

}  // namespace
}  // namespace e3
