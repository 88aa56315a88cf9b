// The Gated DeltaNet's causal convolution (teacher_server/layers/
// causal_conv1d.h): against torch's depthwise conv1d with K - 1 left
// padding then SiLU, sequence by sequence over a packed batch (fp64), and
// the split generation makes: a prefix, then one row at a time from its
// state, equal to the whole sequence; shorter continuations than K - 1
// keep the older state rows.
#include "teacher_server/layers/causal_conv1d.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/rel_inf.h"

namespace e3 {
namespace {

using ::testing::HasSubstr;
using testing::RelInf;

constexpr int64_t kC = 6, kK = 4;

// torch's own depthwise conv over one sequence from zero history.
at::Tensor TorchConv(const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor out = at::conv1d(x.t().unsqueeze(0), w.unsqueeze(1), /*bias=*/{}, /*stride=*/1,
                                    /*padding=*/kK - 1, /*dilation=*/1,
                                    /*groups=*/kC);
  return at::silu(out.squeeze(0).narrow(1, 0, x.size(0)).t());
}

TEST(CausalConv1dTest, MatchesTorchConv1dPerPackedSequence) {
  torch::manual_seed(1);
  const std::vector<int64_t> cu{0, 1, 3, 3, 20};
  const at::Tensor x = torch::randn({20, kC}, torch::kDouble),
                   w = torch::randn({kC, kK}, torch::kDouble);
  const at::Tensor y = CausalConv1dSilu(x, w, cu);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    if (len == 0) continue;
    EXPECT_LT(RelInf(y.narrow(0, cu[s], len), TorchConv(x.narrow(0, cu[s], len), w)), 1e-14)
        << "sequence " << s;
  }
}

TEST(CausalConv1dTest, PrefixThenRowByRowEqualsTheWholeSequence) {
  torch::manual_seed(2);
  const at::Tensor x = torch::randn({12, kC}, torch::kDouble),
                   w = torch::randn({kC, kK}, torch::kDouble);
  const at::Tensor whole = CausalConv1dSilu(x, w, {0, 12});
  at::Tensor state;
  std::vector<at::Tensor> parts{
      CausalConv1dSilu(x.narrow(0, 0, 2), w, {0, 2}, &state)};  // shorter than K - 1
  EXPECT_TRUE(at::equal(state.select(2, 0),
                        torch::zeros({1, kC}, torch::kDouble)));  // the zero history left
  for (int64_t t = 2; t < 12; ++t)
    parts.push_back(CausalConv1dSilu(x.narrow(0, t, 1), w, {0, 1}, &state));
  EXPECT_LT(RelInf(torch::cat(parts), whole), 1e-14);
  EXPECT_TRUE(at::equal(state[0], x.narrow(0, 12 - (kK - 1), kK - 1).t()));
}

TEST(CausalConv1dTest, Bf16RowsAreRoundedOnceFromFp32Sums) {
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({9, kC}).to(torch::kBFloat16),
                   w = torch::randn({kC, kK}).to(torch::kBFloat16);
  const at::Tensor y = CausalConv1dSilu(x, w, {0, 9});
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  const at::Tensor exact = TorchConv(x.to(torch::kDouble), w.to(torch::kDouble));
  // One rounding: within half a bf16 ulp (2^-9 relative) of the exact value, up to the fp32 sum's
  // error.
  EXPECT_LT(RelInf(y.to(torch::kDouble), exact), 2.5e-3);
}

TEST(CausalConv1dTest, BadShapesAreNamed) {
  const at::Tensor x = torch::randn({5, kC}), w = torch::randn({kC, kK});
  at::Tensor wrong = torch::zeros({1, kC, kK});
  EXPECT_THROW(
      {
        try {
          CausalConv1dSilu(x, w, {0, 5}, &wrong);
        } catch (const c10::Error& e) {
          EXPECT_THAT(e.what_without_backtrace(), HasSubstr("the state must be [1, 6, 3]"));
          throw;
        }
      },
      c10::Error);
  EXPECT_THROW(CausalConv1dSilu(x, torch::randn({kC + 1, kK}), {0, 5}), c10::Error);
  EXPECT_THROW(CausalConv1dSilu(x, w, {0, 4}), c10::Error);
}

}  // namespace
}  // namespace e3
