// ops::ProjectForSteps and ops::GatherStepRows against plain autograd
// (mm, then index_select per step) in fp64 on the CPU: the same forward
// rows, input gradient and weight gradient, for steps whose rows repeat
// across steps and for a step whose output the loss never reads.
#include <gtest/gtest.h>

#include <vector>

#include "common/torch/torch_core.h"
#include "student_trainer/ops/step_rows.h"

namespace e3 {
namespace {

double RelInf(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

struct Inputs {
  at::Tensor x, weight, loss_weights;
  std::vector<at::Tensor> rows;
};

Inputs MakeInputs() {
  torch::manual_seed(4);
  const auto f64 = torch::TensorOptions().dtype(at::kDouble);
  Inputs in;
  in.x = torch::randn({9, 6}, f64);
  in.weight = torch::randn({10, 6}, f64);
  in.loss_weights = torch::randn({8, 10}, f64);
  // Three steps over 7 positions of a 9-row table (rows 7 and 8: padding
  // rows), each step's rows distinct, shared across steps.
  in.rows = {torch::tensor({1, 2, 3, 4, 5, 6, 7}, torch::kLong),
             torch::tensor({2, 3, 4, 5, 6, 7, 8}, torch::kLong),
             torch::tensor({3, 5, 7}, torch::kLong)};
  return in;
}

TEST(StepRowsTest, MatchesAutogradOfIndexSelect) {
  const Inputs in = MakeInputs();
  // Plain autograd.
  at::Tensor x_ref = in.x.clone().requires_grad_(true);
  at::Tensor w_ref = in.weight.clone().requires_grad_(true);
  const at::Tensor proj_ref = at::mm(x_ref, w_ref.t());
  at::Tensor loss_ref = at::zeros({}, in.x.options());
  std::vector<at::Tensor> rows_ref;
  for (size_t j = 0; j < in.rows.size(); ++j) {
    rows_ref.push_back(proj_ref.index_select(0, in.rows[j]));
    if (j < 2) loss_ref = loss_ref + (rows_ref.back() * in.loss_weights.narrow(0, 0, rows_ref.back().size(0))).sum() * (j + 1.0);
  }
  loss_ref.backward();

  // The op: the weight gradient accumulates into a buffer that already
  // holds something; `anchor` stands for the flat parameters' edge.
  at::Tensor x = in.x.clone().requires_grad_(true);
  const at::Tensor anchor = torch::zeros({1}, in.x.options()).requires_grad_(true);
  at::Tensor weight_grad = torch::full_like(in.weight, 0.5);
  const ops::ProjectedForSteps p = ops::ProjectForSteps(x, in.weight, weight_grad, anchor);
  at::Tensor loss = at::zeros({}, in.x.options());
  for (size_t j = 0; j < in.rows.size(); ++j) {
    const at::Tensor r = ops::GatherStepRows(p, in.rows[j]);
    EXPECT_TRUE(r.equal(rows_ref[j])) << "step " << j;
    if (j < 2) loss = loss + (r * in.loss_weights.narrow(0, 0, r.size(0))).sum() * (j + 1.0);
  }
  loss.backward();
  EXPECT_LE(RelInf(x.grad(), x_ref.grad()), 1e-13);
  EXPECT_LE(RelInf(weight_grad - 0.5, w_ref.grad()), 1e-13);
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
