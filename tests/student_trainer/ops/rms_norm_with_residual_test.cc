// ops::RmsNormWithResidual against plain autograd (the norm's ATen
// statements, x read again by the residual add) in fp64 on the CPU: the
// same outputs, input gradient and weight gradient when the loss reads
// both outputs, only the normed one, or only the residual.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/torch/torch_core.h"
#include "student_trainer/ops/rms_norm.h"
#include "tests/rel_inf.h"

namespace e3 {
namespace {

constexpr double kNormEps = 1e-6;

using testing::RelInf;

struct Grads {
  at::Tensor normed, residual, dx, dw;
};

// loss = sum(normed * a) + sum(residual * b), either term optional.
at::Tensor Loss(const at::Tensor& normed, const at::Tensor& residual, const at::Tensor& a,
                const at::Tensor& b, bool use_normed, bool use_residual) {
  at::Tensor loss = at::zeros({}, a.options());
  if (use_normed) loss = loss + (normed * a).sum();
  if (use_residual) loss = loss + (residual * b).sum();
  return loss;
}

Grads Reference(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& a,
                const at::Tensor& b, bool use_normed, bool use_residual) {
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor w = w0.clone().requires_grad_(true);
  const at::Tensor normed = w * (x * at::rsqrt(x.pow(2).mean(-1, true) + kNormEps));
  Loss(normed, x, a, b, use_normed, use_residual).backward();
  return {normed.detach(), x.detach(), x.grad(), w.grad().defined() ? w.grad() : at::zeros_like(w0)};
}

Grads Op(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& a, const at::Tensor& b,
         bool use_normed, bool use_residual) {
  at::Tensor x = x0.clone().requires_grad_(true);
  // The weight gradient accumulates into a buffer that already holds
  // something; `anchor` stands for the flat parameters' edge.
  at::Tensor weight_grad = at::full_like(w0, 0.25);
  const at::Tensor anchor = at::zeros({1}, x0.options()).requires_grad_(true);
  const ops::NormedWithResidual out = ops::RmsNormWithResidual(x, w0, weight_grad, anchor, kNormEps);
  Loss(out.normed, out.residual, a, b, use_normed, use_residual).backward();
  return {out.normed.detach(), out.residual.detach(), x.grad(), weight_grad - 0.25};
}

class RmsNormWithResidualTest : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(RmsNormWithResidualTest, MatchesAutogradOfNormAndResidual) {
  const auto [use_normed, use_residual] = GetParam();
  torch::manual_seed(3);
  const auto f64 = torch::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = torch::randn({7, 24}, f64) * 2;
  const at::Tensor w = torch::rand({24}, f64) + 0.5;
  const at::Tensor a = torch::randn({7, 24}, f64), b = torch::randn({7, 24}, f64);
  const Grads ref = Reference(x, w, a, b, use_normed, use_residual);
  const Grads op = Op(x, w, a, b, use_normed, use_residual);
  EXPECT_LE(RelInf(op.normed, ref.normed), 1e-14);
  EXPECT_TRUE(at::equal(op.residual, x));
  ASSERT_TRUE(op.dx.defined());
  EXPECT_LE(RelInf(op.dx, ref.dx), 1e-13);
  if (use_normed) {
    EXPECT_LE(RelInf(op.dw, ref.dw), 1e-13);
  } else {
    EXPECT_EQ(op.dw.abs().max().item<double>(), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(WhichOutputsTheLossReads, RmsNormWithResidualTest,
                         ::testing::Values(std::make_pair(true, true), std::make_pair(true, false),
                                           std::make_pair(false, true)));

// The residual output aliases x (no copy): it is x's storage.
TEST(RmsNormWithResidualAliasTest, TheResidualIsXsStorage) {
  const auto f64 = torch::TensorOptions().dtype(at::kDouble);
  const at::Tensor x = torch::randn({3, 8}, f64).requires_grad_(true);
  at::Tensor weight_grad = at::zeros({8}, f64);
  const at::Tensor anchor = at::zeros({1}, f64).requires_grad_(true);
  const ops::NormedWithResidual out =
      ops::RmsNormWithResidual(x, torch::ones({8}, f64), weight_grad, anchor, kNormEps);
  EXPECT_EQ(out.residual.data_ptr(), x.data_ptr());
}

}  // namespace
}  // namespace e3
