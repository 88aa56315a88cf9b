// The chunked DFlash head and loss (ops/dflash_head_loss.h) against the
// plain formulation of draft/dflash_draft.h, in fp64: the full logits
// materialised, each row's loss (label cross-entropy or distillation),
// the decay or D-PACE weighting, and autograd's gradient. Every chunk size
// gives the same loss, row losses, hits and gradient to fp64 rounding.
#include "student_trainer/ops/dflash_head_loss.h"

#include <gtest/gtest.h>

#include <string>

#include "student_trainer/draft/dflash_draft.h"

namespace e3 {
namespace {

struct LossCase {
  std::string name;
  ops::DFlashWeighting weighting;
  bool distill;
};

class DFlashHeadLossTest : public ::testing::TestWithParam<LossCase> {};

TEST_P(DFlashHeadLossTest, EqualsThePlainFormulationAtEveryChunkSize) {
  const LossCase& c = GetParam();
  torch::manual_seed(17);
  const int64_t B = 4, blocks = 5, R = B * blocks, H = 6, V = 13;
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  const at::Tensor hidden0 = torch::randn({R, H}, f64);
  const at::Tensor head = torch::randn({V, H}, f64);
  const at::Tensor target_hidden = c.distill ? torch::randn({R, H}, f64) : at::Tensor();
  at::Tensor labels = torch::randint(0, V, {R}, torch::kLong);
  for (int64_t r = 0; r < R; r += B) labels[r] = -1;  // anchors
  labels[6] = -1;                                      // past a sample's end
  labels[13] = -1;
  ops::DFlashHeadLossOptions o;
  o.block_size = B;
  o.weighting = c.weighting;
  o.gamma = 2.5;
  o.alpha = 0.3;

  const at::Tensor plain_hidden = hidden0.clone().requires_grad_(true);
  const at::Tensor logits = torch::matmul(plain_hidden, head.t());
  const at::Tensor rows = c.distill ? DFlashRowSoftCe(logits, target_hidden, head) : DFlashRowNll(logits, labels);
  const at::Tensor plain = c.weighting == ops::DFlashWeighting::kDPace ? DFlashDPaceLoss(rows, labels, B, o.alpha)
                                                                        : DFlashWeightedLoss(rows, labels, B, o.gamma);
  plain.backward();
  // Supervised rows: a label, and not a block's anchor (row 0 of each block).
  const at::Tensor supervised =
      labels.ge(0).logical_and(torch::arange(R, torch::kLong).remainder(B).gt(0));
  const at::Tensor want_hits = logits.detach().argmax(-1).eq(labels).logical_and(supervised);
  const at::Tensor want_rows = rows.detach() * supervised.to(torch::kDouble);

  for (int64_t chunk : {1, 3, 8, 1000}) {
    SCOPED_TRACE(chunk);
    o.chunk_rows = chunk;
    const at::Tensor hidden = hidden0.clone().requires_grad_(true);
    const ops::DFlashHeadLossOutput out = ops::DFlashHeadLoss(hidden, head, labels, target_hidden, o);
    (out.loss * 2.0).backward();  // the incoming gradient scales the stored one
    EXPECT_NEAR(out.loss.item<double>(), plain.item<double>(), 1e-12);
    EXPECT_LT((out.row_loss - want_rows).abs().max().item<double>(), 1e-12);
    EXPECT_TRUE(out.hits.equal(want_hits));
    EXPECT_LT((hidden.grad() - 2.0 * plain_hidden.grad()).abs().max().item<double>(), 1e-12);
    EXPECT_GT(hidden.grad().abs().max().item<double>(), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, DFlashHeadLossTest,
                         ::testing::Values(LossCase{"decay_labels", ops::DFlashWeighting::kDecay, false},
                                           LossCase{"dpace_labels", ops::DFlashWeighting::kDPace, false},
                                           LossCase{"decay_distill", ops::DFlashWeighting::kDecay, true},
                                           LossCase{"dpace_distill", ops::DFlashWeighting::kDPace, true}),
                         [](const ::testing::TestParamInfo<LossCase>& i) { return i.param.name; });

TEST(DFlashHeadLossTest, BadShapesAreErrors) {
  const at::Tensor h = torch::randn({8, 3}), head = torch::randn({5, 3});
  ops::DFlashHeadLossOptions o;
  o.block_size = 4;
  EXPECT_THROW(ops::DFlashHeadLoss(h, torch::randn({5, 2}), torch::zeros({8}, torch::kLong), {}, o), c10::Error);
  EXPECT_THROW(ops::DFlashHeadLoss(h, head, torch::zeros({7}, torch::kLong), {}, o), c10::Error);
  EXPECT_THROW(ops::DFlashHeadLoss(h, head, torch::zeros({8}, torch::kLong), torch::randn({8, 2}), o), c10::Error);
}

}  // namespace
}  // namespace e3
