// Unit checks of the rope variants beyond the golden tests: each scaled
// type really changes the frequencies it should, and only those.
#include "teacher_server/layers/rotary.h"

#include <gtest/gtest.h>

#include <cmath>

namespace e3 {
namespace {

TEST(RotaryTest, Llama3KeepsHighAndDividesLowFrequencies) {
  RopeConfig base;
  base.theta = 500000.0;
  RopeConfig llama3 = base;
  llama3.type = RopeType::kLlama3;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_position_embeddings = 8192;
  at::Tensor f0 = ComputeRopeFrequencies(base, 128).inv_freq;
  at::Tensor f1 = ComputeRopeFrequencies(llama3, 128).inv_freq;
  ASSERT_EQ(f1.size(0), 64);
  // Wavelength below 8192/4 = 2048 tokens: unchanged.
  EXPECT_EQ(f1[0].item<float>(), f0[0].item<float>());
  // Wavelength above 8192 tokens: divided by the factor.
  EXPECT_NEAR(f1[63].item<float>(), f0[63].item<float>() / 8.0f, 1e-12);
  // In between: strictly between the two.
  int medium = 0;
  for (int i = 0; i < 64; ++i) {
    double w = 2 * M_PI / f0[i].item<double>();
    if (w > 2048 && w < 8192) {
      ++medium;
      EXPECT_LT(f1[i].item<float>(), f0[i].item<float>());
      EXPECT_GT(f1[i].item<float>(), f0[i].item<float>() / 8.0f);
    }
  }
  EXPECT_GT(medium, 0);
}

TEST(RotaryTest, YarnScalesAttentionAndInterpolatesLowFrequencies) {
  RopeConfig yarn;
  yarn.type = RopeType::kYarn;
  yarn.factor = 4.0;
  yarn.original_max_position_embeddings = 4096;
  auto f = ComputeRopeFrequencies(yarn, 64);
  EXPECT_NEAR(f.attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-12);
  RopeConfig plain;
  at::Tensor f0 = ComputeRopeFrequencies(plain, 64).inv_freq;
  EXPECT_EQ(f.inv_freq[0].item<float>(), f0[0].item<float>());  // extrapolated
  EXPECT_NEAR(f.inv_freq[31].item<float>(), f0[31].item<float>() / 4.0f, 1e-12);  // interpolated
  // DeepSeek-style mscale pair.
  yarn.mscale = 1.0;
  yarn.mscale_all_dim = 0.707;
  auto g = ComputeRopeFrequencies(yarn, 64);
  EXPECT_NEAR(g.attention_scaling, (0.1 * std::log(4.0) + 1.0) / (0.1 * 0.707 * std::log(4.0) + 1.0), 1e-12);
}

TEST(RotaryTest, LinearDividesEverything) {
  RopeConfig linear;
  linear.type = RopeType::kLinear;
  linear.factor = 2.0;
  at::Tensor f1 = ComputeRopeFrequencies(linear, 32).inv_freq;
  at::Tensor f0 = ComputeRopeFrequencies(RopeConfig{}, 32).inv_freq;
  EXPECT_TRUE(torch::allclose(f1 * 2, f0));
}

TEST(RotaryTest, RotationPreservesNormAndPositionZeroIsIdentity) {
  RotaryEmbedding rope(RopeConfig{}, 16, at::kCPU);
  auto [cos, sin] = rope.CosSin(torch::tensor({0, 5, 100}, torch::kLong), at::kFloat);
  at::Tensor x = torch::randn({3, 2, 16});
  at::Tensor y = ApplyRotary(x, cos, sin);
  EXPECT_TRUE(torch::allclose(y[0], x[0]));
  EXPECT_TRUE(torch::allclose(y.norm(2, -1), x.norm(2, -1), 1e-5, 1e-5));
}

}  // namespace
}  // namespace e3
