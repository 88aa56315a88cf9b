// The best draft by real tau: exported only when a measurement beats the
// best so far (with its step and tau in config.json), read back by a
// resumed run so a worse draft never replaces it, and the early stop after
// `patience` measurements without a better tau.
#include "student_trainer/checkpoint/best_draft.h"

#include <gtest/gtest.h>

#include "common/base/file_util.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft/draft_export.h"
#include "tests/scratch_dir.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

// A measurement whose tau at chain 5 is `tau`: tokens per verify round.
AcceptanceReport Report(double tau) {
  AcceptanceReport r;
  r.chain_lengths = {5};
  AcceptanceCounts c;
  c.rounds = 1000;
  c.tokens = static_cast<int64_t>(tau * 1000);
  r.counts = {c};
  return r;
}

BestDraftOptions Options(const std::string& dir, int64_t patience) {
  BestDraftOptions o;
  o.dir = dir;
  o.chain = 5;
  o.patience = patience;
  o.dtype = at::kFloat;
  return o;
}

TEST(BestDraftTest, OnlyABetterTauIsExportedAndAResumeKeepsIt) {
  const std::string dir = testing::ScratchDir("best_draft");
  Eagle3Draft draft = testing::MakeTinyDraft(at::kFloat, 1);
  auto best = BestDraft::Open(Options(dir, 0));
  ASSERT_TRUE(best.ok()) << best.status();
  ASSERT_TRUE(best->Consider(10, Report(1.5), *draft).ok());
  ASSERT_TRUE(best->Consider(20, Report(1.4), *draft).ok());
  ASSERT_TRUE(best->Consider(30, Report(1.5), *draft).ok());  // a tie keeps the earlier draft
  EXPECT_EQ(best->step(), 10);
  EXPECT_DOUBLE_EQ(best->tau(), Report(1.5).TauAt(5));
  const nlohmann::json j = nlohmann::json::parse(ReadFileToString(JoinPath(dir, "config.json")).value());
  EXPECT_EQ(j["e3_best"]["step"], 10);
  EXPECT_EQ(j["e3_best"]["eval_chain"], 5);
  EXPECT_DOUBLE_EQ(j["e3_best"]["tau"].get<double>(), best->tau());
  EXPECT_TRUE(IsRegularFile(JoinPath(dir, "model.safetensors")));

  // A resumed run starts from the recorded best: only a better draft replaces it.
  auto resumed = BestDraft::Open(Options(dir, 0));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->step(), 10);
  ASSERT_TRUE(resumed->Consider(40, Report(1.45), *draft).ok());
  EXPECT_EQ(nlohmann::json::parse(ReadFileToString(JoinPath(dir, "config.json")).value())["e3_best"]["step"], 10);
  ASSERT_TRUE(resumed->Consider(50, Report(1.6), *draft).ok());
  EXPECT_EQ(nlohmann::json::parse(ReadFileToString(JoinPath(dir, "config.json")).value())["e3_best"]["step"], 50);
}

TEST(BestDraftTest, StopsAfterPatienceMeasurementsWithoutABetterTau) {
  Eagle3Draft draft = testing::MakeTinyDraft(at::kFloat, 1);
  auto best = BestDraft::Open(Options("", 2));  // tracked, not exported
  ASSERT_TRUE(best.ok());
  ASSERT_TRUE(best->Consider(1, Report(1.2), *draft).ok());
  ASSERT_TRUE(best->Consider(2, Report(1.1), *draft).ok());
  EXPECT_FALSE(best->ShouldStop());
  ASSERT_TRUE(best->Consider(3, Report(1.3), *draft).ok());  // better: the count starts again
  ASSERT_TRUE(best->Consider(4, Report(1.3), *draft).ok());
  EXPECT_FALSE(best->ShouldStop());
  ASSERT_TRUE(best->Consider(5, Report(1.25), *draft).ok());
  EXPECT_TRUE(best->ShouldStop());
  EXPECT_EQ(best->step(), 3);
  auto never = BestDraft::Open(Options("", 0));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(never->Consider(i, Report(1.0), *draft).ok());
  EXPECT_FALSE(never->ShouldStop());
}

TEST(BestDraftTest, ADamagedBestRecordIsAnErrorNamingTheFile) {
  const std::string dir = testing::ScratchDir("best_draft_damaged");
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "config.json"), R"({"e3_best": {"step": "x"}})").ok());
  auto best = BestDraft::Open(Options(dir, 0));
  ASSERT_FALSE(best.ok());
  EXPECT_NE(std::string(best.status().message()).find(JoinPath(dir, "config.json") + ": field \"e3_best\""),
            std::string::npos)
      << best.status();
}

}  // namespace
}  // namespace e3
