// fp32 master weights under a bf16 draft: the optimizer updates fp32
// copies, so updates far below bf16's resolution still accumulate, and the
// working weights are always the masters rounded to bf16.
#include "common/torch/torch_core.h"
#include "student_trainer/optim/master_weights.h"

#include <gtest/gtest.h>

#include "student_trainer/step/ttt_step.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

using testing::MakeTinyDraft;
using testing::RandomBatch;
using testing::TinyConfig;

// One TTT step with AdamW at `lr` on `trained`, gradients from `work`.
void Step(Eagle3DraftImpl& work, Eagle3DraftImpl& trained, MasterWeights* mw, torch::optim::AdamW& opt,
          const TeacherBatch& batch) {
  opt.zero_grad();
  auto out = RunTtt(work, batch);
  ASSERT_TRUE(out.ok()) << out.status();
  out->loss.backward();
  if (mw != nullptr) mw->PullGradients();
  opt.step();
  if (mw != nullptr) mw->PushWeights();
}

TEST(MasterWeightsTest, TinyUpdatesAccumulateInTheMastersAndWorkWeightsAreTheirRounding) {
  Eagle3Draft work = MakeTinyDraft(at::kBFloat16, /*seed=*/3);
  Eagle3Draft master = MakeTinyDraft(at::kFloat, /*seed=*/3);
  auto mw = MasterWeights::Create(*work, *master);
  ASSERT_TRUE(mw.ok()) << mw.status();
  const auto before = master->fc->weight.clone();
  // An lr of 1e-6 moves each weight by about 1e-6 per step; bf16 weights of
  // magnitude ~0.05 have a spacing of ~2.4e-4, so in pure bf16 almost every
  // update rounds away.
  torch::optim::AdamW opt(master->parameters(), torch::optim::AdamWOptions(1e-6).weight_decay(0));
  const TeacherBatch batch = RandomBatch(TinyConfig(), {9, 7}, /*seed=*/5);
  for (int i = 0; i < 5; ++i) Step(*work, *master, &*mw, opt, batch);

  const at::Tensor moved = (master->fc->weight - before).abs();
  EXPECT_EQ(master->fc->weight.scalar_type(), at::kFloat);
  EXPECT_GT(moved.gt(1e-6).to(at::kFloat).mean().item<double>(), 0.9) << "masters must accumulate small updates";
  EXPECT_LT(moved.max().item<double>(), 1e-5);
  // Work weights are exactly the rounded masters, parameter by parameter.
  auto w = work->named_parameters();
  auto m = master->named_parameters();
  ASSERT_EQ(w.size(), m.size());
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(w[i].value().scalar_type(), at::kBFloat16) << w[i].key();
    EXPECT_TRUE(w[i].value().equal(m[i].value().to(at::kBFloat16))) << w[i].key();
    EXPECT_FALSE(w[i].value().grad().defined()) << w[i].key() << ": work gradients are cleared after the pull";
  }
}

TEST(MasterWeightsTest, PureBf16TrainingLosesTheSameUpdates) {
  // The control for the test above: the same updates applied to bf16
  // parameters directly leave most weights unchanged.
  Eagle3Draft work = MakeTinyDraft(at::kBFloat16, /*seed=*/3);
  const auto before = work->fc->weight.clone();
  torch::optim::AdamW opt(work->parameters(), torch::optim::AdamWOptions(1e-6).weight_decay(0));
  const TeacherBatch batch = RandomBatch(TinyConfig(), {9, 7}, /*seed=*/5);
  for (int i = 0; i < 5; ++i) Step(*work, *work, nullptr, opt, batch);
  const double changed = work->fc->weight.ne(before).to(at::kFloat).mean().item<double>();
  EXPECT_LT(changed, 0.2);
}

TEST(MasterWeightsTest, GradientsMatchAnFp32ComputationOfTheSameWeights) {
  // The pulled master gradient is the bf16 gradient, widened: compare with
  // an fp32 draft holding the same (bf16-representable) weights.
  Eagle3Draft work = MakeTinyDraft(at::kBFloat16, /*seed=*/4);
  Eagle3Draft master = MakeTinyDraft(at::kFloat, /*seed=*/4);
  {
    torch::NoGradGuard g;
    for (auto& p : master->parameters()) p.copy_(p.to(at::kBFloat16).to(at::kFloat));
  }
  auto mw = MasterWeights::Create(*work, *master);
  ASSERT_TRUE(mw.ok());
  const TeacherBatch batch = RandomBatch(TinyConfig(), {12}, /*seed=*/6);
  auto out = RunTtt(*work, batch);
  ASSERT_TRUE(out.ok());
  out->loss.backward();
  mw->PullGradients();
  auto ref = RunTtt(*master, batch);
  ASSERT_TRUE(ref.ok());
  // Reference gradients into a separate list (the masters hold the pulled ones).
  std::vector<at::Tensor> pulled;
  for (auto& p : master->parameters()) pulled.push_back(p.grad().clone());
  for (auto& p : master->parameters()) p.mutable_grad().reset();
  ref->loss.backward();
  size_t i = 0;
  for (auto& p : master->parameters()) {
    const at::Tensor& g = p.grad();
    const double scale = g.abs().max().item<double>() + 1e-12;
    const double err = (pulled[i] - g).abs().max().item<double>() / scale;
    // bf16 activations carry ~3 significant digits; a few percent of the
    // largest entry is the expected agreement.
    EXPECT_LT(err, 0.08) << "parameter " << i;
    EXPECT_EQ(pulled[i].scalar_type(), at::kFloat);
    ++i;
  }
}

TEST(MasterWeightsTest, RejectsMismatchedModules) {
  Eagle3Draft work = MakeTinyDraft(at::kBFloat16);
  auto other_cfg = TinyConfig();
  other_cfg.intermediate_size = 48;
  Eagle3Draft master = MakeTinyDraft(at::kFloat, 7, other_cfg);
  auto mw = MasterWeights::Create(*work, *master);
  ASSERT_FALSE(mw.ok());
  EXPECT_NE(std::string(mw.status().message()).find("mlp"), std::string::npos) << mw.status();
  Eagle3Draft half_master = MakeTinyDraft(at::kBFloat16);
  auto bad = MasterWeights::Create(*work, *half_master);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("expected float32"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace e3
