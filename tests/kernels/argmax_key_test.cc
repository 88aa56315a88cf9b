// The key order the lm_head argmax GEMM merges tiles with
// (kernels/argmax_key.h) against at::argmax's rules, on the CPU: the GPU
// kernel's answer is the largest key of a row, so these orderings are what
// make it at::argmax's (sgl_kernels_gpu_test checks the kernel itself).
#include "kernels/argmax_key.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace e3::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(ArgmaxKeyTest, LargerValuesWinAcrossSignsAndInfinities) {
  const std::vector<float> ascending = {-kInf, -3.0e38f, -2.f, -1.f, -1e-30f, 0.f, 1e-30f, 1.f, 2.f, 3.0e38f, kInf};
  for (size_t i = 0; i + 1 < ascending.size(); ++i) {
    // The larger value wins even at a higher column.
    EXPECT_LT(ArgmaxKey(ascending[i], 0), ArgmaxKey(ascending[i + 1], 1000)) << ascending[i];
  }
  EXPECT_GT(ArgmaxKey(-kInf, 7), 0ull) << "key 0 must stay below every real key";
}

TEST(ArgmaxKeyTest, TiesGoToTheLowerColumnAndSignedZerosTie) {
  EXPECT_GT(ArgmaxKey(1.5f, 3), ArgmaxKey(1.5f, 4));
  EXPECT_GT(ArgmaxKey(-0.f, 3), ArgmaxKey(0.f, 4));
  EXPECT_GT(ArgmaxKey(0.f, 3), ArgmaxKey(-0.f, 4));
}

TEST(ArgmaxKeyTest, NanBeatsEverythingAndTheFirstNanWins) {
  EXPECT_GT(ArgmaxKey(kNaN, 100), ArgmaxKey(kInf, 0));
  EXPECT_GT(ArgmaxKey(kNaN, 5), ArgmaxKey(kNaN, 6));
  EXPECT_GT(ArgmaxKey(-kNaN, 5), ArgmaxKey(kInf, 0)) << "a NaN with the sign bit set is still a NaN";
}

TEST(ArgmaxKeyTest, TheColumnRoundTrips) {
  for (uint32_t col : {0u, 1u, 128255u, (1u << 30) - 1}) {
    EXPECT_EQ(ArgmaxFromKey(ArgmaxKey(0.25f, col)), static_cast<int32_t>(col));
    EXPECT_EQ(ArgmaxFromKey(ArgmaxKey(kNaN, col)), static_cast<int32_t>(col));
  }
}

// What a vocab-parallel rank sends its peers: the key's value, exactly.
TEST(ArgmaxKeyTest, TheValueRoundTrips) {
  for (float v : {-kInf, -3.0e38f, -1.f, -1e-30f, 0.f, 1e-30f, 0.25f, 3.0e38f, kInf}) {
    EXPECT_EQ(ArgmaxValueFromKey(ArgmaxKey(v, 17)), v);
  }
  const float from_negative_zero = ArgmaxValueFromKey(ArgmaxKey(-0.f, 3));
  EXPECT_EQ(from_negative_zero, 0.f);
  EXPECT_FALSE(std::signbit(from_negative_zero)) << "-0 ties with +0, so its key holds +0";
  EXPECT_TRUE(std::isnan(ArgmaxValueFromKey(ArgmaxKey(kNaN, 9))));
  EXPECT_TRUE(std::isnan(ArgmaxValueFromKey(ArgmaxKey(-kNaN, 9))));
  EXPECT_EQ(ArgmaxValueFromKey(0), -kInf) << "key 0 (no candidate) reads as -inf";
}

// The max key over a row picks what at::argmax picks (first NaN, else the
// first maximum) on rows that mix all the cases.
TEST(ArgmaxKeyTest, TheMaxKeyOfARowIsTheReferenceArgmax) {
  const std::vector<std::vector<float>> rows = {
      {0.5f, 2.f, -1.f, 2.f, 1.f},   // tie: 1
      {-kInf, -kInf, -kInf},          // all -inf: 0
      {1.f, kNaN, 3.f, kNaN},         // first NaN: 1
      {-0.f, 0.f, -0.f},              // signed zeros tie: 0
      {-5.f, -4.f, -4.5f},            // negatives: 1
  };
  const std::vector<int32_t> expected = {1, 0, 1, 0, 1};
  for (size_t r = 0; r < rows.size(); ++r) {
    unsigned long long best = 0;
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const unsigned long long key = ArgmaxKey(rows[r][c], static_cast<uint32_t>(c));
      best = key > best ? key : best;
    }
    EXPECT_EQ(ArgmaxFromKey(best), expected[r]) << "row " << r;
  }
}

// The pair comparison the row argmax kernel reduces with is the key order,
// on every pair of special and ordinary values at distinct columns.
TEST(ArgmaxKeyTest, ThePairComparisonIsTheKeyOrder) {
  const std::vector<float> values = {kNaN, -kNaN, -kInf, -3.0e38f, -1.f, -1e-30f, -0.f, 0.f, 1e-30f, 1.f, 3.0e38f, kInf};
  const std::vector<int32_t> cols = {0, 1, 7, 128255, 0x7fffffff};
  for (float a : values) {
    for (float b : values) {
      for (int32_t ia : cols) {
        for (int32_t ib : cols) {
          if (ia == ib) continue;
          EXPECT_EQ(ArgmaxPrefers(a, ia, b, ib),
                    ArgmaxKey(a, static_cast<uint32_t>(ia)) > ArgmaxKey(b, static_cast<uint32_t>(ib)))
              << a << "@" << ia << " vs " << b << "@" << ib;
        }
      }
    }
  }
}

}  // namespace
}  // namespace e3::kernels
