// The C++ draft + TTT in bf16 on a GPU (the trainer's default there),
// against the same fp64 reference as eagle3_ttt_golden_test.
//
// Tolerances (relative to each tensor's max |value|): bf16 keeps 8
// significant bits (rounding 2^-9, 0.2%) on every matmul input and
// activation, and TTT feeds each step's hidden state into the next, so
// rounding compounds over the 7 unrolled steps and their backward. Bounds:
// logits 5e-2, losses 2e-2, gradients 2e-1; acc may differ by 5% of the
// step's loss tokens where rounding flips near-tie argmaxes. The target
// distribution is computed from an fp32 head, as in training.
// Measured (LibTorch 2.11) on fixtures at fixed TTT positions; the
// fixtures with advancing positions, and golden_fixed_positions, pass the
// same bounds, both kernel choices:
// golden: logits 9.7e-3 (fast step 7.2e-3), losses 3.4e-3 (4.5e-3), grads
// 9.3e-3 (9.3e-3), tau 2.379 (2.376) vs 2.416; golden_no_agreement (random
// weights, gradients near noise): logits 2.4e-2 (2.6e-2), losses 1.3e-3
// (1.2e-3), grads 9.6e-2 (9.9e-2). The gradient bound is twice the worst
// measured, as bf16 rounding of near-cancelling sums varies by kernel.
#include <gtest/gtest.h>

#include <string>

#include "tests/student_trainer/eagle3_golden.h"

namespace e3 {
namespace {

// Both the reference op sequence and the fast step (its kernels and flash
// attention), within the same bounds.
class Eagle3TttBf16GpuTest : public ::testing::TestWithParam<std::tuple<std::string, TttKernels>> {};

TEST_P(Eagle3TttBf16GpuTest, MatchesIndependentReferenceWithinBf16Bounds) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  testing::CompareWithGolden(std::get<0>(GetParam()), at::kBFloat16,
                             {/*logits=*/5e-2, /*loss=*/2e-2, /*grad=*/2e-1, /*acc_hits=*/0, /*acc_share=*/0.05},
                             at::Device(at::kCUDA, 0), std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Cases, Eagle3TttBf16GpuTest,
                         ::testing::Combine(::testing::Values("golden", "golden_no_agreement",
                                                              "golden_fixed_positions", "golden_eagle31"),
                                            ::testing::Values(TttKernels::kReference, TttKernels::kFast)));

}  // namespace
}  // namespace e3
