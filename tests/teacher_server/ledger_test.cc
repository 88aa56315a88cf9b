// The ledger on disk: a restarted teacher reads its file back, so the
// report covers every process of the run and commits continue from each
// rank's committed cursor; a half-written last line (the
// process died mid-write) is cut off; a corrupt line or a file of another
// dataset is an error naming the file.
#include "teacher_server/ledger.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/file_util.h"

namespace e3 {
namespace {

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeTempDir("ledger_test_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    path_ = JoinPath(dir_, "ledger.jsonl");
  }
  void TearDown() override { (void)RemoveAll(dir_); }

  void AppendRaw(const std::string& text) {
    std::ofstream(path_, std::ios::app | std::ios::binary) << text;
  }

  std::string dir_, path_;
};

TEST_F(LedgerTest, AReopenedLedgerCoversTheWholeRun) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 6).ok());
    first.RecordDelivery(0, 0, 0, {0, 1, 2});
    first.RecordCommit(0, 0, 0, {0, 1, 2});
    first.RecordDelivery(0, 0, 1, {3, 4, 5});  // delivered, never committed: the process dies
  }
  Ledger second;
  ASSERT_TRUE(second.Open(path_, 6).ok());
  second.RecordDelivery(0, 0, 1, {3, 4, 5});  // redelivered after the restart
  second.RecordCommit(0, 0, 1, {3, 4, 5});
  const LedgerReport r = second.Report(/*complete_epochs=*/1);
  EXPECT_EQ(r.deliveries, 3);
  EXPECT_EQ(r.redeliveries, 1);
  EXPECT_EQ(r.committed_batches, 2);
  EXPECT_EQ(r.committed_samples, 6);
  EXPECT_EQ(r.samples_committed_twice, 0);
  EXPECT_EQ(r.samples_never_committed, 0);
}

TEST_F(LedgerTest, AReopenedLedgerGivesBackTheWorldAndEachRanksCommittedCursor) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 8).ok());
    EXPECT_EQ(first.restored().world, 0) << "a new file restores nothing";
    first.RecordEvent(R"({"event":"subscribe","rank":0,"world":2,"subscriber":"rank-0","epoch":0,"batch":0})");
    first.RecordCommit(0, 0, 0, {0});
    first.RecordCommit(0, 0, 1, {2});
    first.RecordCommit(1, 0, 0, {1});
    // Rank 1 came back from an older checkpoint.
    first.RecordEvent(R"({"event":"rewind","rank":1,"from_epoch":0,"from_batch":1,"to_epoch":0,"to_batch":0})");
  }
  Ledger second;
  ASSERT_TRUE(second.Open(path_, 8).ok());
  EXPECT_EQ(second.restored().world, 2);
  ASSERT_EQ(second.restored().committed.size(), 2u);
  EXPECT_EQ(second.restored().committed.at(0).epoch, 0);
  EXPECT_EQ(second.restored().committed.at(0).next_batch, 2);
  EXPECT_EQ(second.restored().committed.at(1).next_batch, 0);
}

TEST_F(LedgerTest, ASubscribeEventWithAnImpossibleWorldIsAnError) {
  AppendRaw("{\"event\":\"open\",\"dataset_samples\":4}\n{\"event\":\"subscribe\",\"rank\":0,\"world\":0}\n");
  Ledger ledger;
  absl::Status st = ledger.Open(path_, 4);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find(path_ + ":2"), std::string::npos) << st;
  EXPECT_NE(st.message().find("world 0"), std::string::npos) << st;
}

TEST_F(LedgerTest, AHalfWrittenLastLineIsCutOff) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 3).ok());
    first.RecordCommit(0, 0, 0, {0, 1, 2});
  }
  auto before = ReadFileToString(path_);
  ASSERT_TRUE(before.ok());
  AppendRaw("{\"event\":\"commit\",\"torn_marker\":1,\"ep");
  Ledger second;
  ASSERT_TRUE(second.Open(path_, 3).ok());
  auto after = ReadFileToString(path_);
  ASSERT_TRUE(after.ok());
  // The torn line is gone; the reopening's own "open" event follows.
  EXPECT_EQ(after->substr(0, before->size()), *before);
  EXPECT_EQ(after->find("torn_marker"), std::string::npos);
  const LedgerReport r = second.Report(1);
  EXPECT_EQ(r.committed_batches, 1);
  EXPECT_EQ(r.samples_never_committed, 0);
}

TEST_F(LedgerTest, ACorruptLineIsAnErrorNamingFileAndLine) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 3).ok());
  }
  AppendRaw("not json\n");
  AppendRaw("{\"event\":\"commit\",\"rank\":0,\"epoch\":0,\"index\":0,\"samples\":[1]}\n");
  Ledger second;
  const absl::Status st = second.Open(path_, 3);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(st.message()).find(path_ + ":2"), std::string::npos) << st;
}

TEST_F(LedgerTest, ACommitWithoutItsFieldsIsAnError) {
  AppendRaw("{\"event\":\"commit\",\"rank\":0,\"epoch\":0,\"samples\":[1]}\n");
  Ledger ledger;
  const absl::Status st = ledger.Open(path_, 3);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("\"index\""), std::string::npos) << st;
}

TEST_F(LedgerTest, ALedgerOfAnotherDatasetIsRefused) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 10).ok());
  }
  Ledger second;
  const absl::Status st = second.Open(path_, 12);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(st.message()).find("10 samples"), std::string::npos) << st;
}

}  // namespace
}  // namespace e3
