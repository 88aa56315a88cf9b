// A teacher serving several student groups: each group is a data stream
// of its own over the same model (its world, cursors, commits, ledger and
// shm names), a group the teacher does not serve is refused naming those
// it does, and the teacher's "done" and drain span every group.
#include "teacher_server/engine/student_groups.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/base/file_util.h"
#include "teacher_server/runtime/serialized_model.h"
#include "tests/scratch_dir.h"
#include "tests/teacher_server/engine/engine_world.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

EngineOptions GroupsOptions(const std::string& dir) {
  EngineOptions o;
  o.tokens_per_batch = 400;
  o.aux_layer_ids = {0, 2, 4};
  o.transports = {TransportKind::kShm, TransportKind::kInline};
  o.shm_prefix = "/e3groupstest";
  o.ledger_path = dir.empty() ? "" : JoinPath(dir, "ledger.jsonl");  // empty: in memory
  return o;
}

// Takes, acks and commits every batch of `rank` until the end of its data;
// returns the samples it was sent.
std::vector<int64_t> TrainToTheEnd(Engine& e, int rank, int world, const std::string& id, TransportKind transport) {
  SubscribeParams p;
  p.subscriber_id = id;
  p.rank = rank;
  p.world_size = world;
  p.transport = transport;
  const uint64_t generation = e.Subscribe(p).value();
  std::vector<int64_t> samples;
  while (true) {
    const ReadyBatch b = testing::NextBatch(e, rank, generation);
    if (b.end_of_data || b.payload == nullptr) break;
    samples.insert(samples.end(), b.sample_ids.begin(), b.sample_ids.end());
    EXPECT_TRUE(e.Ack(rank, id, {b.batch_id}, Cursor{b.epoch, b.index + 1}).ok());
  }
  return samples;
}

TEST(StudentGroupsTest, EachGroupIsADataStreamOfItsOwn) {
  const std::string dir = testing::ScratchDir("student_groups");
  testing::EngineWorld w = testing::MakeEngineWorld(10, /*seed=*/7);
  SerializedCausalLM serialized(w.model.get());  // the groups' engines share it
  auto groups = StudentGroups::Create(&serialized, w.dataset.get(), GroupsOptions(dir), {"dflash"});
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ((*groups)->names(), (std::vector<std::string>{"dflash"}));
  Engine& first = (*groups)->default_group();
  Engine* dflash = (*groups)->Find("dflash").value();
  ASSERT_NE(dflash, &first);
  EXPECT_EQ((*groups)->Find("").value(), &first);

  // The default group trains as one rank, the other as two: each sees the
  // whole dataset once, in its own world.
  const std::vector<int64_t> one = TrainToTheEnd(first, 0, 1, "eagle-0", TransportKind::kInline);
  EXPECT_FALSE((*groups)->EveryEpochCommitted(1)) << "the other group has not trained yet";
  const std::vector<int64_t> r0 = TrainToTheEnd(*dflash, 0, 2, "dflash-0", TransportKind::kShm);
  const std::vector<int64_t> r1 = TrainToTheEnd(*dflash, 1, 2, "dflash-1", TransportKind::kInline);
  EXPECT_EQ(one.size(), 10u);
  EXPECT_EQ(r0.size() + r1.size(), 10u);
  EXPECT_EQ(first.world_size(), 1);
  EXPECT_EQ(dflash->world_size(), 2);
  EXPECT_TRUE((*groups)->EveryEpochCommitted(1));
  EXPECT_TRUE((*groups)->EveryRankToldTheEnd());

  // Each group's ledger: its own file, each sample committed once.
  EXPECT_TRUE(PathExists(JoinPath(dir, "ledger.jsonl")));
  EXPECT_TRUE(PathExists(JoinPath(dir, "ledger.dflash.jsonl")));
  const auto reports = (*groups)->ledger_reports();
  ASSERT_EQ(reports.size(), 2u);
  for (const auto& [group, report] : reports) {
    EXPECT_EQ(report.committed_samples, 10) << group;
    EXPECT_EQ(report.samples_committed_twice, 0) << group;
    EXPECT_EQ(report.samples_never_committed, 0) << group;
  }
  EXPECT_EQ((*groups)->stats().batches_computed, first.stats().batches_computed + dflash->stats().batches_computed);
  EXPECT_TRUE((*groups)->ledger_failure().ok());
}

TEST(StudentGroupsTest, TheGroupsNameDifferentShmSegments) {
  const std::string dir = testing::ScratchDir("student_groups_shm");
  testing::EngineWorld w = testing::MakeEngineWorld(4, /*seed=*/7);
  SerializedCausalLM serialized(w.model.get());  // the groups' engines share it
  auto groups = StudentGroups::Create(&serialized, w.dataset.get(), GroupsOptions(dir), {"b"});
  ASSERT_TRUE(groups.ok()) << groups.status();
  SubscribeParams p;
  p.subscriber_id = "s";
  p.transport = TransportKind::kShm;
  Engine& first = (*groups)->default_group();
  Engine& other = *(*groups)->Find("b").value();
  const ReadyBatch a = testing::NextBatch(first, 0, first.Subscribe(p).value());
  const ReadyBatch b = testing::NextBatch(other, 0, other.Subscribe(p).value());
  ASSERT_NE(a.payload, nullptr);
  ASSERT_NE(b.payload, nullptr);
  EXPECT_EQ(a.batch_id, b.batch_id);
  EXPECT_NE(a.payload->shm_name(), b.payload->shm_name());
  // Both under the prefix GetInfo announces, so a student opens either.
  EXPECT_EQ(a.payload->shm_name().rfind(first.shm_segment_prefix(), 0), 0u);
  EXPECT_EQ(b.payload->shm_name().rfind(first.shm_segment_prefix(), 0), 0u);
}

TEST(StudentGroupsTest, AGroupNotServedIsRefusedNamingThoseThatAre) {
  testing::EngineWorld w = testing::MakeEngineWorld(4, /*seed=*/7);
  SerializedCausalLM serialized(w.model.get());  // the groups' engines share it
  auto groups = StudentGroups::Create(&serialized, w.dataset.get(), GroupsOptions(""), {"dflash", "e31"});
  ASSERT_TRUE(groups.ok()) << groups.status();
  auto missing = (*groups)->Find("medusa");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("serves no student group \"medusa\"; it serves the default group and dflash, e31"));
}

TEST(StudentGroupsTest, BadGroupNamesAreRefusedAtStartup) {
  testing::EngineWorld w = testing::MakeEngineWorld(4, /*seed=*/7);
  SerializedCausalLM serialized(w.model.get());  // the groups' engines share it
  for (const std::vector<std::string>& names :
       std::vector<std::vector<std::string>>{{"a/b"}, {"x", "x"}, {""}, {std::string(65, 'g')}}) {
    auto groups = StudentGroups::Create(&serialized, w.dataset.get(), GroupsOptions(""), names);
    EXPECT_EQ(groups.status().code(), absl::StatusCode::kInvalidArgument) << names.front();
    EXPECT_THAT(std::string(groups.status().message()), HasSubstr("teachers.student_groups"));
  }
}

TEST(StudentGroupsTest, EachGroupsLedgerLiesBesideTheDefaultOne) {
  EXPECT_EQ(GroupLedgerPath("run/ledger-0.jsonl", "dflash"), "run/ledger-0.dflash.jsonl");
  EXPECT_EQ(GroupLedgerPath("run/ledger", "dflash"), "run/ledger.dflash");
  EXPECT_EQ(GroupLedgerPath("run/ledger.jsonl", ""), "run/ledger.jsonl");
  EXPECT_EQ(GroupLedgerPath("", "dflash"), "");
}

}  // namespace
}  // namespace e3
