// The gated delta rule (teacher_server/layers/gated_delta_rule.h) in fp64
// on the CPU: the recurrent statement against a scalar loop written from
// the recurrence itself, the chunked statement against the recurrent one
// over packed ragged sequences (lengths around the chunk size, and empty
// ones) with and without initial states, and the split that generation
// makes: a prefix in chunks, then token by token from its final state,
// equal to the whole sequence at once. Also fp32 chunks over a long
// sequence against fp64, and the errors that name what is wrong.
#include "teacher_server/layers/gated_delta_rule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/rel_inf.h"

namespace e3 {
namespace {

using ::testing::HasSubstr;
using testing::RelInf;

constexpr int64_t kH = 3, kDk = 8, kDv = 5;

// Inputs as the model prepares them: q and k L2-normalised (q also
// scaled), decays g in (-2, 0], beta in (0, 1).
GatedDeltaRuleInputs RandomInputs(int64_t T, at::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto o = torch::TensorOptions().dtype(dtype);
  auto unit = [](const at::Tensor& x) { return x / x.norm(2, -1, /*keepdim=*/true); };
  GatedDeltaRuleInputs in;
  in.q = unit(torch::randn({T, kH, kDk}, o)) / std::sqrt(static_cast<double>(kDk));
  in.k = unit(torch::randn({T, kH, kDk}, o));
  in.v = torch::randn({T, kH, kDv}, o);
  in.g = -2.0 * torch::rand({T, kH}, o);
  in.beta = torch::rand({T, kH}, o);
  return in;
}

// The recurrence element by element, for one sequence from a zero state.
at::Tensor ScalarLoop(const GatedDeltaRuleInputs& in) {
  const int64_t T = in.q.size(0);
  at::Tensor out = torch::zeros({T, kH, kDv}, torch::kDouble);
  auto q = in.q.accessor<double, 3>(), k = in.k.accessor<double, 3>(),
       v = in.v.accessor<double, 3>();
  auto g = in.g.accessor<double, 2>(), beta = in.beta.accessor<double, 2>();
  auto o = out.accessor<double, 3>();
  for (int64_t h = 0; h < kH; ++h) {
    std::vector<std::vector<double>> s(kDk, std::vector<double>(kDv, 0.0));
    for (int64_t t = 0; t < T; ++t) {
      for (auto& row : s) {
        for (double& x : row) x *= std::exp(g[t][h]);
      }
      for (int64_t j = 0; j < kDv; ++j) {
        double read = 0.0;
        for (int64_t i = 0; i < kDk; ++i) read += s[i][j] * k[t][h][i];
        const double delta = beta[t][h] * (v[t][h][j] - read);
        for (int64_t i = 0; i < kDk; ++i) s[i][j] += k[t][h][i] * delta;
      }
      for (int64_t j = 0; j < kDv; ++j) {
        for (int64_t i = 0; i < kDk; ++i) o[t][h][j] += s[i][j] * q[t][h][i];
      }
    }
  }
  return out;
}

GatedDeltaRuleInputs Slice(const GatedDeltaRuleInputs& in, int64_t begin, int64_t length) {
  return {in.q.narrow(0, begin, length), in.k.narrow(0, begin, length),
          in.v.narrow(0, begin, length), in.g.narrow(0, begin, length),
          in.beta.narrow(0, begin, length)};
}

TEST(GatedDeltaRuleTest, RecurrentMatchesTheScalarRecurrence) {
  const GatedDeltaRuleInputs in = RandomInputs(37, torch::kDouble, 1);
  EXPECT_LT(RelInf(GatedDeltaRuleRecurrent(in, {0, 37}), ScalarLoop(in)), 1e-13);
}

TEST(GatedDeltaRuleTest, ChunkedMatchesRecurrentOverPackedRaggedSequences) {
  const std::vector<int64_t> cu{0, 1, 64, 64, 127, 192, 392};  // lengths 1, 63, 0, 63, 65, 200
  const GatedDeltaRuleInputs in = RandomInputs(cu.back(), torch::kDouble, 2);
  for (bool with_initial : {false, true}) {
    at::Tensor s_rec, s_chunk;
    if (with_initial) {
      s_rec = torch::randn({6, kH, kDk, kDv}, torch::kDouble);
      s_chunk = s_rec.clone();
    }
    const at::Tensor expected = GatedDeltaRuleRecurrent(in, cu, &s_rec);
    for (int64_t chunk : {16, 64}) {
      at::Tensor s = with_initial ? s_chunk.clone() : at::Tensor();
      const at::Tensor got = GatedDeltaRuleChunked(in, cu, &s, chunk);
      EXPECT_LT(RelInf(got, expected), 1e-11)
          << "chunk " << chunk << (with_initial ? ", initial states" : "");
      EXPECT_LT(RelInf(s, s_rec), 1e-11) << "chunk " << chunk;
    }
    // The empty sequence keeps its initial state.
    if (with_initial) EXPECT_TRUE(at::equal(s_rec[2], s_chunk[2]));
  }
}

TEST(GatedDeltaRuleTest, PrefixInChunksThenTokensEqualsTheWholeSequence) {
  const int64_t T = 150, prefix = 97;
  const GatedDeltaRuleInputs in = RandomInputs(T, torch::kDouble, 3);
  const at::Tensor whole = GatedDeltaRuleRecurrent(in, {0, T});
  at::Tensor state;
  const at::Tensor head = GatedDeltaRuleChunked(Slice(in, 0, prefix), {0, prefix}, &state);
  std::vector<at::Tensor> parts{head};
  for (int64_t t = prefix; t < T; ++t)
    parts.push_back(GatedDeltaRuleRecurrent(Slice(in, t, 1), {0, 1}, &state));
  EXPECT_LT(RelInf(torch::cat(parts), whole), 1e-11);
}

TEST(GatedDeltaRuleTest, Fp32ChunksStayCloseToFp64OverALongSequence) {
  const int64_t T = 2048;
  const GatedDeltaRuleInputs exact = RandomInputs(T, torch::kDouble, 4);
  const GatedDeltaRuleInputs f32{exact.q.to(torch::kFloat), exact.k.to(torch::kFloat),
                                 exact.v.to(torch::kFloat), exact.g.to(torch::kFloat),
                                 exact.beta.to(torch::kFloat)};
  const at::Tensor got = GatedDeltaRuleChunked(f32, {0, T});
  EXPECT_EQ(got.scalar_type(), torch::kFloat);
  EXPECT_LT(RelInf(got.to(torch::kDouble), GatedDeltaRuleRecurrent(exact, {0, T})), 1e-4);
}

TEST(GatedDeltaRuleTest, BadInputsAreNamed) {
  const GatedDeltaRuleInputs in = RandomInputs(10, torch::kDouble, 5);
  auto message = [&](const GatedDeltaRuleInputs& x, const std::vector<int64_t>& cu, at::Tensor* s) {
    try {
      GatedDeltaRuleChunked(x, cu, s);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message(in, {0, 9}, nullptr), HasSubstr("cu_seqlens must run from 0 to the 10 rows"));
  EXPECT_THAT(message(in, {0, 6, 4, 10}, nullptr), HasSubstr("cu_seqlens must not decrease"));
  GatedDeltaRuleInputs bad = in;
  bad.beta = bad.beta.narrow(0, 0, 9);
  EXPECT_THAT(message(bad, {0, 10}, nullptr), HasSubstr("g and beta must be [10, 3]"));
  at::Tensor wrong_state = torch::zeros({2, kH, kDk, kDv}, torch::kDouble);
  EXPECT_THAT(message(in, {0, 10}, &wrong_state), HasSubstr("the state must be [1, 3, 8, 5]"));
}

}  // namespace
}  // namespace e3
