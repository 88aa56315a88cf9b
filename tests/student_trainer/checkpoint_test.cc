// Checkpoints round-trip the draft, the optimizer state and the cursor,
// keep only the newest ones, and report damage clearly.
#include "student_trainer/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/file_util.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

std::string Scratch(const std::string& name) {
  std::string dir = JoinPath(::testing::TempDir(), name + "_" + std::to_string(::getpid()));
  (void)RemoveAll(dir);
  return dir;
}

TEST(CheckpointTest, RoundTripsWeightsOptimizerAndCursor) {
  const std::string dir = Scratch("ckpt_roundtrip");
  Eagle3Draft a = testing::MakeTinyDraft(at::kFloat, 1);
  torch::optim::AdamW opt_a(a->parameters(), torch::optim::AdamWOptions(1e-2));
  // One real step so the optimizer has moments to save.
  for (auto& p : a->parameters()) p.mutable_grad() = torch::ones_like(p);
  opt_a.step();
  TrainerState st;
  st.step = 12;
  st.cursors = {{1, 5}, {0, 7}};
  st.tokens = 3456;
  st.subscriber_id = "rank-0";
  auto path = SaveCheckpoint(dir, st, *a, opt_a);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(IsRegularFile(JoinPath(*path, "model.safetensors")));

  Eagle3Draft b = testing::MakeTinyDraft(at::kFloat, 2);  // different init
  torch::optim::AdamW opt_b(b->parameters(), torch::optim::AdamWOptions(1e-2));
  auto loaded = LoadLatestCheckpoint(dir, *b, opt_b);
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
  // The same gradient then moves both identically: the moments came along.
  for (auto* d : {&a, &b}) {
    for (auto& p : (*d)->parameters()) p.mutable_grad() = torch::full_like(p, 0.5);
  }
  opt_a.step();
  opt_b.step();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i])) << i;
}

TEST(CheckpointTest, KeepsTheNewestAndStartsFreshWithoutOne) {
  const std::string dir = Scratch("ckpt_keep");
  Eagle3Draft d = testing::MakeTinyDraft();
  torch::optim::AdamW opt(d->parameters(), torch::optim::AdamWOptions(1e-3));
  auto none = LoadLatestCheckpoint(dir, *d, opt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  TrainerState st;
  for (int64_t s : {10, 20, 30}) {
    st.step = s;
    ASSERT_TRUE(SaveCheckpoint(dir, st, *d, opt, /*keep=*/2).ok());
  }
  auto entries = ListDir(dir);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000020", "step-00000030"}));
  EXPECT_EQ(*ReadFileToString(JoinPath(dir, "latest")), "step-00000030\n");
}

TEST(CheckpointTest, DamageIsReportedNamingTheFile) {
  const std::string dir = Scratch("ckpt_damage");
  Eagle3Draft d = testing::MakeTinyDraft();
  torch::optim::AdamW opt(d->parameters(), torch::optim::AdamWOptions(1e-3));
  TrainerState st;
  st.step = 3;
  auto path = SaveCheckpoint(dir, st, *d, opt);
  ASSERT_TRUE(path.ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(*path, "trainer_state.json"), "{\"step\": \"three\"}").ok());
  auto bad_state = LoadLatestCheckpoint(dir, *d, opt);
  ASSERT_FALSE(bad_state.ok());
  EXPECT_NE(bad_state.status().message().find("trainer_state.json"), std::string::npos) << bad_state.status();
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "latest"), "step-99999999\n").ok());
  auto dangling = LoadLatestCheckpoint(dir, *d, opt);
  ASSERT_FALSE(dangling.ok());
  EXPECT_NE(dangling.status().message().find("step-99999999"), std::string::npos);
}

}  // namespace
}  // namespace e3
