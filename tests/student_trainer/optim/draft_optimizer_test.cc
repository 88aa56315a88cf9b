// The fused AdamW (one update over the flat buffers) against the reference
// optimizer (LibTorch's AdamW and clip_grad_norm_ per parameter) on the
// same gradients: the same arithmetic in another grouping, so fp32 weights
// agree to a few ulps after several clipped steps with weight decay (bound
// 1e-6 absolute on weights of order 0.02-1; measured about 1e-8), and the
// bf16 working weights are the same roundings of them.
#include "student_trainer/optim/draft_optimizer.h"

#include <gtest/gtest.h>

#include "student_trainer/step/ttt_step.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

using testing::MakeTinyDraft;
using testing::RandomBatch;

DraftOptimizerOptions OptimizerOptions(double clip) {
  DraftOptimizerOptions o;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.weight_decay = 0.05;
  o.grad_clip = clip;
  return o;
}

double MaxDiff(Eagle3DraftImpl& a, Eagle3DraftImpl& b) {
  return (a.flat().data().to(at::kDouble) - b.flat().data().to(at::kDouble))
      .abs()
      .max()
      .item<double>();
}

// Runs `steps` optimizer steps on both drafts with gradients of the same
// batches, taken from `grad_source` so both see identical gradients.
void TrainBoth(Eagle3DraftImpl& grad_source, DraftOptimizer& a, Eagle3DraftImpl& draft_a,
               DraftOptimizer& b, Eagle3DraftImpl& draft_b, int steps) {
  for (int s = 0; s < steps; ++s) {
    grad_source.flat().ZeroGrad();
    auto out = RunTtt(grad_source, RandomBatch(grad_source.config(), {9, 6}, /*seed=*/30 + s));
    ASSERT_TRUE(out.ok()) << out.status();
    out->loss.backward();
    const at::Tensor g = grad_source.flat().grad().clone() * 40;  // large enough to clip
    for (auto [opt, draft] :
         {std::pair<DraftOptimizer*, Eagle3DraftImpl*>{&a, &draft_a}, {&b, &draft_b}}) {
      opt->BeginStep();
      draft->flat().grad().copy_(g);
      ASSERT_TRUE(opt->FinishStep(1e-2 * (s + 1)).ok());
    }
  }
}

TEST(DraftOptimizerTest, FusedMatchesReferenceInFp32WithClipping) {
  Eagle3Draft source = MakeTinyDraft(at::kFloat, 3);
  Eagle3Draft a = MakeTinyDraft(at::kFloat, 3), b = MakeTinyDraft(at::kFloat, 3);
  auto ref =
      CreateDraftOptimizer(DraftOptimizerKind::kReference, *a, nullptr, nullptr, OptimizerOptions(0.5));
  auto fused = CreateDraftOptimizer(DraftOptimizerKind::kFused, *b, nullptr, nullptr, OptimizerOptions(0.5));
  ASSERT_TRUE(ref.ok() && fused.ok());
  const at::Tensor before = a->flat().data().clone();
  TrainBoth(*source, **ref, *a, **fused, *b, 4);
  EXPECT_GT((a->flat().data() - before).abs().max().item<double>(),
            1e-3);  // the steps moved the weights
  EXPECT_LE(MaxDiff(*a, *b), 1e-6);
}

TEST(DraftOptimizerTest, FusedMatchesReferenceWithoutClipping) {
  Eagle3Draft source = MakeTinyDraft(at::kFloat, 4);
  Eagle3Draft a = MakeTinyDraft(at::kFloat, 4), b = MakeTinyDraft(at::kFloat, 4);
  auto ref = CreateDraftOptimizer(DraftOptimizerKind::kReference, *a, nullptr, nullptr, OptimizerOptions(0));
  auto fused = CreateDraftOptimizer(DraftOptimizerKind::kFused, *b, nullptr, nullptr, OptimizerOptions(0));
  ASSERT_TRUE(ref.ok() && fused.ok());
  TrainBoth(*source, **ref, *a, **fused, *b, 3);
  EXPECT_LE(MaxDiff(*a, *b), 1e-6);
}

TEST(DraftOptimizerTest, Bf16WorkingWeightsAreTheMastersRounded) {
  Eagle3Draft source = MakeTinyDraft(at::kBFloat16, 5);
  Eagle3Draft work_a = MakeTinyDraft(at::kBFloat16, 5), master_a = MakeTinyDraft(at::kFloat, 5);
  Eagle3Draft work_b = MakeTinyDraft(at::kBFloat16, 5), master_b = MakeTinyDraft(at::kFloat, 5);
  auto ref = CreateDraftOptimizer(DraftOptimizerKind::kReference, *work_a, &*master_a, nullptr,
                                  OptimizerOptions(0.5));
  auto fused =
      CreateDraftOptimizer(DraftOptimizerKind::kFused, *work_b, &*master_b, nullptr, OptimizerOptions(0.5));
  ASSERT_TRUE(ref.ok() && fused.ok());
  TrainBoth(*source, **ref, *work_a, **fused, *work_b, 3);
  EXPECT_LE(MaxDiff(*master_a, *master_b), 1e-6);
  EXPECT_TRUE(work_b->flat().data().equal(master_b->flat().data().to(at::kBFloat16)));
  EXPECT_TRUE(work_a->flat().data().equal(master_a->flat().data().to(at::kBFloat16)));
}

}  // namespace
}  // namespace e3
