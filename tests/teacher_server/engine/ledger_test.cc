// The ledger on disk: a restarted teacher reads its file back, so the
// report covers every process of the run and commits continue from each
// rank's committed cursor; a half-written line (the process died, or a
// write failed, mid-line) is dropped; a corrupt line or a file of another
// dataset is an error naming the file; a write that fails is cut back off
// the file, counts for nothing and is returned; the file is locked.
#include "teacher_server/engine/ledger.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "tests/file_size_limit.h"

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
    ASSERT_TRUE(first.RecordDelivery(0, 0, 0, {0, 1, 2}).ok());
    ASSERT_TRUE(first.RecordCommit(0, 0, 0, {0, 1, 2}).ok());
    ASSERT_TRUE(first.RecordDelivery(0, 0, 1, {3, 4, 5}).ok());  // delivered, never committed: the process dies
  }
  Ledger second;
  ASSERT_TRUE(second.Open(path_, 6).ok());
  ASSERT_TRUE(second.RecordDelivery(0, 0, 1, {3, 4, 5}).ok());  // redelivered after the restart
  ASSERT_TRUE(second.RecordCommit(0, 0, 1, {3, 4, 5}).ok());
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
    ASSERT_TRUE(first.RecordEvent(R"({"event":"subscribe","rank":0,"world":2,"subscriber":"rank-0","epoch":0,"batch":0})").ok());
    ASSERT_TRUE(first.RecordCommit(0, 0, 0, {0}).ok());
    ASSERT_TRUE(first.RecordCommit(0, 0, 1, {2}).ok());
    ASSERT_TRUE(first.RecordCommit(1, 0, 0, {1}).ok());
    // Rank 1 came back from an older checkpoint.
    ASSERT_TRUE(first.RecordEvent(R"({"event":"rewind","rank":1,"from_epoch":0,"from_batch":1,"to_epoch":0,"to_batch":0})").ok());
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
    ASSERT_TRUE(first.RecordCommit(0, 0, 0, {0, 1, 2}).ok());
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

TEST_F(LedgerTest, ASecondLedgerOnTheSameFileIsRefused) {
  Ledger first;
  ASSERT_TRUE(first.Open(path_, 3).ok());
  Ledger second;
  const absl::Status st = second.Open(path_, 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(std::string(st.message()).find("in use by another process"), std::string::npos) << st;
}

TEST_F(LedgerTest, AFailedWriteIsCutOffCountsForNothingAndStopsOnlyUntilWritesWork) {
  Ledger ledger;
  ASSERT_TRUE(ledger.Open(path_, 6).ok());
  ASSERT_TRUE(ledger.RecordCommit(0, 0, 0, {0, 1}).ok());
  const std::string before = ReadFileToString(path_).value();
  {
    // Room for part of a line, not a whole one: the write is torn.
    testing::FileSizeLimit full(before.size() + 10);
    ASSERT_TRUE(full.ok());
    const absl::Status st = ledger.RecordCommit(0, 0, 1, {2, 3});
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(std::string(st.message()).find(path_), std::string::npos) << st;
    EXPECT_NE(std::string(st.message()).find("takes no commit"), std::string::npos) << st;
    EXPECT_FALSE(ledger.RecordDelivery(0, 0, 2, {4, 5}).ok());
  }
  EXPECT_EQ(ReadFileToString(path_).value(), before) << "the torn line stays in the file";
  LedgerReport r = ledger.Report(0);
  EXPECT_EQ(r.committed_batches, 1);
  EXPECT_EQ(r.deliveries, 0);
  EXPECT_EQ(r.write_failures, 2);
  EXPECT_FALSE(ledger.first_failure().ok());
  // The disk has room again: the same commit goes in, once.
  ASSERT_TRUE(ledger.RecordCommit(0, 0, 1, {2, 3}).ok());
  r = ledger.Report(0);
  EXPECT_EQ(r.committed_batches, 2);
  EXPECT_EQ(r.samples_committed_twice, 0);
}

TEST_F(LedgerTest, ATornLineFollowedByAWholeEventIsRecovered) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 4).ok());
    ASSERT_TRUE(first.RecordCommit(0, 0, 0, {0, 1}).ok());
  }
  // An older writer's failed write left a fragment, and the next event
  // was appended after it on the same line.
  AppendRaw("{\"event\":\"commit\",\"rank\":0,\"ep");
  AppendRaw("{\"event\":\"commit\",\"rank\":0,\"epoch\":0,\"index\":1,\"samples\":[2,3]}\n");
  Ledger second;
  ASSERT_TRUE(second.Open(path_, 4).ok());
  const LedgerReport r = second.Report(1);
  EXPECT_EQ(r.committed_batches, 2);
  EXPECT_EQ(r.samples_never_committed, 0);
  EXPECT_EQ(second.restored().committed.at(0).next_batch, 2);
}

TEST_F(LedgerTest, OnlyACommittedWorldIsRestored) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 8).ok());
    // A subscriber that never trained claimed a world of 20.
    ASSERT_TRUE(first.RecordEvent(R"({"event":"subscribe","rank":0,"world":20,"subscriber":"x","epoch":0,"batch":0})").ok());
  }
  {
    Ledger second;
    ASSERT_TRUE(second.Open(path_, 8).ok());
    EXPECT_EQ(second.restored().world, 0);
    ASSERT_TRUE(second.RecordWorld(1).ok());
    ASSERT_TRUE(second.RecordCommit(0, 0, 0, {0}).ok());
  }
  Ledger third;
  ASSERT_TRUE(third.Open(path_, 8).ok());
  EXPECT_EQ(third.restored().world, 1);
}

TEST_F(LedgerTest, EachRanksFurthestDeliveryIsRestored) {
  {
    Ledger first;
    ASSERT_TRUE(first.Open(path_, 8).ok());
    ASSERT_TRUE(first.RecordDelivery(0, 0, 0, {0}).ok());
    ASSERT_TRUE(first.RecordDelivery(0, 0, 3, {6}).ok());
    ASSERT_TRUE(first.RecordDelivery(0, 0, 1, {2}).ok());  // a redelivery after a rewind
    ASSERT_TRUE(first.RecordDelivery(1, 1, 0, {1}).ok());
    ASSERT_TRUE(first.SyncDeliveries().ok());
  }
  Ledger second;
  ASSERT_TRUE(second.Open(path_, 8).ok());
  const auto& delivered = second.restored().delivered;
  ASSERT_EQ(delivered.size(), 2u);
  EXPECT_EQ(delivered.at(0).epoch, 0);
  EXPECT_EQ(delivered.at(0).next_batch, 4);
  EXPECT_EQ(delivered.at(1).epoch, 1);
  EXPECT_EQ(delivered.at(1).next_batch, 1);
}

}  // namespace
}  // namespace e3
