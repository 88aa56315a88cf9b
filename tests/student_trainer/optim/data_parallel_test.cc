// Data parallelism through DraftOptimizer, for every pairing of the TTT
// step (reference, fast) and the optimizer (reference: the bucketed
// reducer during backward; fused: one flat all-reduce after it), on a real
// c10d Gloo group of two ranks (two threads on a loopback store): the ranks
// end every step with bit-identical weights, equal within fp32 rounding to
// one rank training on the whole batch.
#include <gtest/gtest.h>

#include <tuple>

#include "common/torch/process_group.h"
#include "student_trainer/optim/draft_optimizer.h"
#include "student_trainer/step/ttt_step.h"
#include "tests/student_trainer/tiny_draft.h"
#include "tests/student_trainer/two_ranks.h"

namespace e3 {
namespace {

using testing::MakeTinyDraft;
using testing::RandomBatch;
using testing::RunTwoRanks;
using testing::SliceSample;
using testing::TinyConfig;

constexpr int kSteps = 3;

absl::Status Train(Eagle3DraftImpl& draft, const TeacherBatch& batch, ProcessGroup* group,
                   DraftOptimizerKind kind, TttKernels kernels) {
  DraftOptimizerOptions o;
  o.weight_decay = 0.0;
  auto opt = CreateDraftOptimizer(kind, draft, nullptr, group, o);
  if (!opt.ok()) return opt.status();
  TttOptions ttt;
  ttt.kernels = kernels;
  for (int s = 0; s < kSteps; ++s) {
    (*opt)->BeginStep();
    auto out = RunTtt(draft, batch, ttt);
    if (!out.ok()) return out.status();
    out->loss.backward();
    absl::Status st = (*opt)->FinishStep(1e-3);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

class DataParallelTest
    : public ::testing::TestWithParam<std::tuple<DraftOptimizerKind, TttKernels>> {};

TEST_P(DataParallelTest, TwoRanksOnHalvesEqualOneRankOnTheWholeBatch) {
  const auto [kind, kernels] = GetParam();
  const TeacherBatch full = RandomBatch(TinyConfig(), {16, 16}, /*seed=*/5);
  Eagle3Draft single = MakeTinyDraft(at::kFloat, /*seed=*/3);
  ASSERT_TRUE(Train(*single, full, nullptr, kind, kernels).ok());
  Eagle3Draft drafts[2] = {MakeTinyDraft(at::kFloat, 3), MakeTinyDraft(at::kFloat, 3)};
  const auto status = RunTwoRanks([&](int r, ProcessGroup* group) {
    return Train(*drafts[r], SliceSample(full, 16 * r, 16), group, kind, kernels);
  });
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  const at::Tensor w0 = drafts[0]->flat().data(), w1 = drafts[1]->flat().data(),
                   ws = single->flat().data();
  EXPECT_TRUE(w0.equal(w1)) << "ranks must hold bit-identical weights";
  EXPECT_FALSE(w0.equal(MakeTinyDraft(at::kFloat, 3)->flat().data()))
      << "the steps must move the weights";
  // fp32: two half-batch means averaged against one mean, then AdamW's
  // normalised update (see gradient_reducer_test).
  const double err = ((w0 - ws).abs().max() / ws.abs().max()).item<double>();
  EXPECT_LT(err, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Pairings, DataParallelTest,
                         ::testing::Combine(::testing::Values(DraftOptimizerKind::kReference,
                                                              DraftOptimizerKind::kFused),
                                            ::testing::Values(TttKernels::kReference,
                                                              TttKernels::kFast)));

}  // namespace
}  // namespace e3
