// Checkpoints round-trip the draft, the optimizer state and the cursor,
// keep only the newest ones, and report damage clearly. Both optimizer
// implementations write one state format, so a checkpoint of either
// resumes with either, and both still read LibTorch's archive of earlier
// checkpoints.
#include "student_trainer/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/file_util.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

std::unique_ptr<DraftOptimizer> Optimizer(DraftOptimizerKind kind, Eagle3Draft& d) {
  DraftOptimizerOptions o;
  o.weight_decay = 0.1;
  auto opt = CreateDraftOptimizer(kind, *d, nullptr, nullptr, o);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(opt).value();
}

// One optimizer step with every gradient `g`.
void StepWith(DraftOptimizer& opt, Eagle3Draft& d, double g) {
  opt.BeginStep();
  d->flat().grad().fill_(g);
  ASSERT_TRUE(opt.FinishStep(1e-2).ok());
}

const char* KindName(DraftOptimizerKind k) { return k == DraftOptimizerKind::kFused ? "fused" : "reference"; }

std::string Scratch(const std::string& name) {
  std::string dir = JoinPath(::testing::TempDir(), name + "_" + std::to_string(::getpid()));
  (void)RemoveAll(dir);
  return dir;
}

struct KindPair {
  DraftOptimizerKind save, load;
};

class CheckpointRoundTripTest : public ::testing::TestWithParam<KindPair> {};

TEST_P(CheckpointRoundTripTest, RoundTripsWeightsOptimizerAndCursor) {
  const KindPair kinds = GetParam();
  const std::string dir = Scratch(std::string("ckpt_roundtrip_") + KindName(kinds.save) + "_" + KindName(kinds.load));
  Eagle3Draft a = testing::MakeTinyDraft(at::kFloat, 1);
  auto opt_a = Optimizer(kinds.save, a);
  // One real step so the optimizer has moments to save.
  StepWith(*opt_a, a, 1.0);
  TrainerState st;
  st.step = 12;
  st.cursors = {{1, 5}, {0, 7}};
  st.tokens = 3456;
  st.subscriber_id = "rank-0";
  auto path = SaveCheckpoint(dir, st, *a, *opt_a);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(IsRegularFile(JoinPath(*path, "model.safetensors")));
  EXPECT_TRUE(IsRegularFile(JoinPath(*path, "optimizer.safetensors")));

  Eagle3Draft b = testing::MakeTinyDraft(at::kFloat, 2);  // different init
  auto opt_b = Optimizer(kinds.load, b);
  auto loaded = LoadLatestCheckpoint(dir, *b, *opt_b);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->step, 12);
  ASSERT_EQ((*loaded)->cursors.size(), 2u);
  EXPECT_EQ((*loaded)->cursors[0].epoch, 1);
  EXPECT_EQ((*loaded)->cursors[0].next_batch, 5);
  EXPECT_EQ((*loaded)->cursors[1].next_batch, 7);
  EXPECT_EQ((*loaded)->tokens, 3456);
  auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i])) << i;
  // The same gradient then moves both alike: the moments and the step
  // count came along (the two implementations round an ulp apart).
  StepWith(*opt_a, a, 0.5);
  StepWith(*opt_b, b, 0.5);
  for (size_t i = 0; i < pa.size(); ++i) {
    const double diff = (pa[i] - pb[i]).abs().max().item<double>();
    if (kinds.save == kinds.load) {
      EXPECT_EQ(diff, 0.0) << i;
    } else {
      EXPECT_LE(diff, 1e-6) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, CheckpointRoundTripTest,
                         ::testing::Values(KindPair{DraftOptimizerKind::kReference, DraftOptimizerKind::kReference},
                                           KindPair{DraftOptimizerKind::kFused, DraftOptimizerKind::kFused},
                                           KindPair{DraftOptimizerKind::kFused, DraftOptimizerKind::kReference},
                                           KindPair{DraftOptimizerKind::kReference, DraftOptimizerKind::kFused}));

TEST(CheckpointTest, EarlierCheckpointsWithLibTorchsArchiveStillLoad) {
  const std::string dir = Scratch("ckpt_legacy");
  Eagle3Draft a = testing::MakeTinyDraft(at::kFloat, 1);
  auto opt_a = Optimizer(DraftOptimizerKind::kReference, a);
  StepWith(*opt_a, a, 1.0);
  TrainerState st;
  st.step = 1;
  auto path = SaveCheckpoint(dir, st, *a, *opt_a);
  ASSERT_TRUE(path.ok()) << path.status();
  // Rewrite the optimizer state as LibTorch's archive, as checkpoints
  // were before optimizer.safetensors.
  {
    std::vector<at::Tensor> params;
    for (const auto& [name, p] : a->ExportedParameters()) params.push_back(p);
    torch::optim::AdamW torch_opt(params, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1));
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    torch::serialize::OutputArchive archive;
    torch_opt.step();
    torch_opt.save(archive);
    archive.save_to(JoinPath(*path, "optimizer.pt"));
    ASSERT_TRUE(RemoveAll(JoinPath(*path, "optimizer.safetensors")).ok());
  }
  for (DraftOptimizerKind kind : {DraftOptimizerKind::kReference, DraftOptimizerKind::kFused}) {
    SCOPED_TRACE(KindName(kind));
    Eagle3Draft b = testing::MakeTinyDraft(at::kFloat, 2);
    auto opt_b = Optimizer(kind, b);
    auto loaded = LoadLatestCheckpoint(dir, *b, *opt_b);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(loaded->has_value());
  }
}

TEST(CheckpointTest, KeepsTheNewestAndStartsFreshWithoutOne) {
  const std::string dir = Scratch("ckpt_keep");
  Eagle3Draft d = testing::MakeTinyDraft();
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  auto none = LoadLatestCheckpoint(dir, *d, *opt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  TrainerState st;
  for (int64_t s : {10, 20, 30}) {
    st.step = s;
    ASSERT_TRUE(SaveCheckpoint(dir, st, *d, *opt, /*keep=*/2).ok());
  }
  auto entries = ListDir(dir);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000020", "step-00000030"}));
  EXPECT_EQ(*ReadFileToString(JoinPath(dir, "latest")), "step-00000030\n");
}

TEST(CheckpointTest, DamageIsReportedNamingTheFile) {
  const std::string dir = Scratch("ckpt_damage");
  Eagle3Draft d = testing::MakeTinyDraft();
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  TrainerState st;
  st.step = 3;
  auto path = SaveCheckpoint(dir, st, *d, *opt);
  ASSERT_TRUE(path.ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(*path, "trainer_state.json"), "{\"step\": \"three\"}").ok());
  auto bad_state = LoadLatestCheckpoint(dir, *d, *opt);
  ASSERT_FALSE(bad_state.ok());
  EXPECT_NE(bad_state.status().message().find("trainer_state.json"), std::string::npos) << bad_state.status();
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "latest"), "step-99999999\n").ok());
  auto dangling = LoadLatestCheckpoint(dir, *d, *opt);
  ASSERT_FALSE(dangling.ok());
  EXPECT_NE(dangling.status().message().find("step-99999999"), std::string::npos);
}

TEST(CheckpointTest, ACorruptOptimizerStateNamesTheFile) {
  const std::string dir = Scratch("ckpt_bad_optimizer");
  Eagle3Draft d = testing::MakeTinyDraft();
  auto opt = Optimizer(DraftOptimizerKind::kFused, d);
  TrainerState st;
  auto path = SaveCheckpoint(dir, st, *d, *opt);
  ASSERT_TRUE(path.ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(*path, "optimizer.safetensors"), "not a safetensors file").ok());
  for (DraftOptimizerKind kind : {DraftOptimizerKind::kReference, DraftOptimizerKind::kFused}) {
    auto o = Optimizer(kind, d);
    auto loaded = LoadLatestCheckpoint(dir, *d, *o);
    ASSERT_FALSE(loaded.ok());
    EXPECT_NE(loaded.status().message().find("optimizer.safetensors"), std::string::npos) << loaded.status();
  }
}

}  // namespace
}  // namespace e3
