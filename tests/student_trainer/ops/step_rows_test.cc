// ops::ProjectNormedForSteps and ops::GatherStepRows against plain autograd
// (RMSNorm, mm, then index_select per step) in fp64 on the CPU: the same
// forward rows and the same gradients of the norm weight and the
// projection (a column block of a wider matrix, as the q/k/v embedding
// half), for steps whose rows repeat across steps and for a step whose
// output the loss never reads.
#include <gtest/gtest.h>

#include <vector>

#include "common/torch/torch_core.h"
#include "student_trainer/ops/step_rows.h"
#include "tests/rel_inf.h"

namespace e3 {
namespace {

using testing::RelInf;

struct Inputs {
  at::Tensor x, norm_weight, weight_wide, loss_weights;
  std::vector<at::Tensor> rows;
};

constexpr double kEps = 1e-6;

Inputs MakeInputs() {
  torch::manual_seed(4);
  const auto f64 = torch::TensorOptions().dtype(at::kDouble);
  Inputs in;
  in.x = torch::randn({9, 6}, f64);
  in.norm_weight = torch::randn({6}, f64);
  in.weight_wide = torch::randn({10, 12}, f64);  // the projection: columns 0..5
  in.loss_weights = torch::randn({8, 10}, f64);
  // Three steps over 7 positions of a 9-row table (rows 7 and 8: padding
  // rows), each step's rows distinct, shared across steps.
  in.rows = {torch::tensor({1, 2, 3, 4, 5, 6, 7}, torch::kLong),
             torch::tensor({2, 3, 4, 5, 6, 7, 8}, torch::kLong),
             torch::tensor({3, 5, 7}, torch::kLong)};
  return in;
}

// The loss the test reads: the first two steps' rows, weighted by step.
at::Tensor StepLoss(const at::Tensor& rows, size_t step, const Inputs& in) {
  if (step >= 2) return at::zeros({}, rows.options());
  return (rows * in.loss_weights.narrow(0, 0, rows.size(0))).sum() * (step + 1.0);
}

// The first two steps' rows are ranges ([1, 8) and [2, 9)); with
// `use_ranges` they are gathered as views.
class StepRowsRangeTest : public ::testing::TestWithParam<bool> {};

TEST_P(StepRowsRangeTest, MatchesAutogradOfNormProjectionAndIndexSelect) {
  const Inputs in = MakeInputs();
  const std::vector<int64_t> first_rows = GetParam() ? std::vector<int64_t>{1, 2, -1} : std::vector<int64_t>{-1, -1, -1};
  // Plain autograd.
  at::Tensor nw_ref = in.norm_weight.clone().requires_grad_(true);
  at::Tensor w_ref = in.weight_wide.narrow(1, 0, 6).clone().requires_grad_(true);
  const at::Tensor normed = nw_ref * (in.x * at::rsqrt(in.x.pow(2).mean(-1, true) + kEps));
  const at::Tensor proj_ref = at::mm(normed, w_ref.t());
  at::Tensor loss_ref = at::zeros({}, in.x.options());
  std::vector<at::Tensor> rows_ref;
  for (size_t j = 0; j < in.rows.size(); ++j) {
    rows_ref.push_back(proj_ref.index_select(0, in.rows[j]));
    loss_ref = loss_ref + StepLoss(rows_ref.back(), j, in);
  }
  loss_ref.backward();

  // The op: the gradients accumulate into buffers that already hold
  // something; `anchor` stands for the flat parameters' edge.
  const at::Tensor anchor = torch::zeros({1}, in.x.options()).requires_grad_(true);
  at::Tensor grad_wide = torch::full_like(in.weight_wide, 0.5);
  at::Tensor norm_grad = torch::full_like(in.norm_weight, 0.25);
  const ops::ProjectedForSteps p = ops::ProjectNormedForSteps(
      in.x, in.norm_weight, norm_grad, in.weight_wide.narrow(1, 0, 6), grad_wide.narrow(1, 0, 6), anchor, kEps);
  at::Tensor loss = at::zeros({}, in.x.options());
  for (size_t j = 0; j < in.rows.size(); ++j) {
    const at::Tensor r = ops::GatherStepRows(p, in.rows[j], first_rows[j]);
    EXPECT_LE(RelInf(r, rows_ref[j]), 1e-14) << "step " << j;
    loss = loss + StepLoss(r, j, in);
  }
  loss.backward();
  EXPECT_LE(RelInf(norm_grad - 0.25, nw_ref.grad()), 1e-13);
  EXPECT_LE(RelInf(grad_wide.narrow(1, 0, 6) - 0.5, w_ref.grad()), 1e-13);
  EXPECT_TRUE(grad_wide.narrow(1, 6, 6).eq(0.5).all().item<bool>()) << "the other columns were written";
}

INSTANTIATE_TEST_SUITE_P(Gather, StepRowsRangeTest, ::testing::Bool());

TEST(StepRowsTest, RefusesARangePastTheProjection) {
  const Inputs in = MakeInputs();
  const at::Tensor anchor = torch::zeros({1}, in.x.options()).requires_grad_(true);
  at::Tensor weight_grad = torch::zeros({10, 6}, in.x.options());
  at::Tensor norm_grad = torch::zeros({6}, in.x.options());
  const ops::ProjectedForSteps p = ops::ProjectNormedForSteps(in.x, in.norm_weight, norm_grad,
                                                              in.weight_wide.narrow(1, 0, 6), weight_grad, anchor, kEps);
  EXPECT_THROW(ops::GatherStepRows(p, in.rows[0], 3), c10::Error);  // rows [3, 10) of 9
}

TEST(StepRowsTest, RefusesAnInputThatTakesAGradient) {
  const Inputs in = MakeInputs();
  const at::Tensor anchor = torch::zeros({1}, in.x.options()).requires_grad_(true);
  at::Tensor weight_grad = torch::zeros({10, 6}, in.x.options());
  at::Tensor norm_grad = torch::zeros({6}, in.x.options());
  EXPECT_THROW(ops::ProjectNormedForSteps(in.x.clone().requires_grad_(true), in.norm_weight, norm_grad,
                                          in.weight_wide.narrow(1, 0, 6), weight_grad, anchor, kEps),
               c10::Error);
  EXPECT_THROW(ops::ProjectNormedForSteps(in.x, in.norm_weight.narrow(0, 0, 5), norm_grad.narrow(0, 0, 5),
                                          in.weight_wide.narrow(1, 0, 6), weight_grad, anchor, kEps),
               c10::Error);
}

// The sum itself: adds of the same row sum, a wrong width is refused, Take empties it.
TEST(StepRowsTest, SumsRowsAndRefusesAGradientOfTheWrongWidth) {
  ops::StepRowsGradient g(4, 8, torch::TensorOptions().dtype(at::kFloat));
  EXPECT_THROW(g.Add(torch::tensor({0, 1}, torch::kLong), torch::zeros({2, 7})), c10::Error);
  EXPECT_FALSE(g.Take(at::kFloat).defined());
  g.Add(torch::tensor({0, 3}, torch::kLong), torch::ones({2, 8}));
  g.Add(torch::tensor({0}, torch::kLong), torch::ones({1, 8}));
  const at::Tensor sum = g.Take(at::kFloat);
  EXPECT_EQ(sum[0][0].item<float>(), 2.f);
  EXPECT_EQ(sum[3][7].item<float>(), 1.f);
  EXPECT_EQ(sum[1].abs().sum().item<float>(), 0.f);
}

}  // namespace
}  // namespace e3
