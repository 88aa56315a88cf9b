#include "common/dtype.h"

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
  auto bad = ParseDType("F8_E4M3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("F8_E4M3"), std::string::npos);
  EXPECT_EQ(*ParseComputeDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseComputeDType("FP32"), DType::kF32);
  EXPECT_FALSE(ParseComputeDType("int8").ok());
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
