// The teacher engine on a real (small) model: delivery exactly once across
// ranks and epochs, redelivery after a resubscribe, the credit window, and
// reclaiming a dead subscriber's buffers (shm segments included).
#include "teacher_server/engine/engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "common/base/file_util.h"
#include "tests/file_size_limit.h"
#include "tests/teacher_server/engine/engine_world.h"
#include "tests/wait_for.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

EngineOptions SmallBatches() {
  EngineOptions o;
  o.tokens_per_batch = 120;
  o.aux_layer_ids = {0, 2, 4};
  o.transports = {TransportKind::kShm, TransportKind::kInline};
  o.shm_prefix = "/e3test";
  return o;
}


// Subscribes `rank` of a `world`-rank run as `id` from `resume`, with a
// credit window of two batches.
uint64_t SubscribeRank(Engine& e, int rank, int world, const std::string& id, Cursor resume = {}) {
  SubscribeParams p;
  p.world_size = world;
  p.credit_window = 2;
  p.subscriber_id = id;
  p.rank = rank;
  p.resume = resume;
  return e.Subscribe(p).value();
}

// The ack a student sends with the checkpoint it writes as it stops.
AckParams FinalReport(int rank, const std::string& id, uint64_t generation, std::vector<int64_t> batch_ids,
                      Cursor committed) {
  AckParams a;
  a.rank = rank;
  a.subscriber_id = id;
  a.generation = generation;
  a.batch_ids = std::move(batch_ids);
  a.committed = committed;
  a.final_report = true;
  return a;
}

// The worker computes asynchronously (a loaded machine may take seconds
// per batch), so the tests poll with WaitFor.
using testing::WaitFor;

int CountShmSegments(const std::string& prefix) {
  int n = 0;
  const std::vector<std::string> names = ListDir("/dev/shm").value();
  for (const auto& name : names) {
    if (name.rfind(prefix.substr(1), 0) == 0) ++n;
  }
  return n;
}

TEST(EngineTest, EverySampleReachesExactlyOneRankOncePerEpoch) {
  testing::EngineWorld w = testing::MakeEngineWorld(37, /*seed=*/3);
  EngineOptions o = SmallBatches();
  o.epochs = 2;
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::map<int, uint64_t> gen;
  for (int r = 0; r < 2; ++r) {
    SubscribeParams p;
    p.subscriber_id = "s" + std::to_string(r);
    p.rank = r;
    p.world_size = 2;
    p.transport = r == 0 ? TransportKind::kShm : TransportKind::kInline;
    gen[r] = *(*engine)->Subscribe(p);
  }
  std::map<int64_t, std::multiset<int64_t>> seen;  // epoch -> samples
  const int64_t per_epoch = (*engine)->batches_per_epoch(2);
  std::set<int> done;
  std::map<int, Cursor> next{{0, {}}, {1, {}}};
  while (done.size() < 2) {
    for (int r = 0; r < 2; ++r) {
      if (done.count(r)) continue;
      ReadyBatch b = testing::NextBatch(**engine, r, gen[r]);
      if (b.end_of_data) {
        done.insert(r);
        continue;
      }
      EXPECT_EQ(b.epoch, next[r].epoch);
      EXPECT_EQ(b.index, next[r].next_batch);  // in order, none skipped
      ASSERT_NE(b.payload, nullptr);
      EXPECT_EQ(b.payload->transport(), r == 0 ? TransportKind::kShm : TransportKind::kInline);
      int64_t tokens = 0;
      for (int64_t s : b.sample_ids) {
        seen[b.epoch].insert(s);
        tokens += (*w.dataset)[s].size();
      }
      EXPECT_EQ(tokens, b.num_tokens);
      EXPECT_EQ(b.payload->tensors()[3].name, "aux_hidden");
      EXPECT_EQ(b.payload->tensors()[3].shape, (std::vector<int64_t>{b.num_tokens, 3 * 64}));
      next[r] = {b.epoch, b.index + 1};
      if (next[r].next_batch == per_epoch) next[r] = {b.epoch + 1, 0};
      ASSERT_TRUE((*engine)->Ack(r, "s" + std::to_string(r), {b.batch_id}, next[r]).ok());
    }
  }
  for (int64_t e = 0; e < 2; ++e) {
    ASSERT_EQ(seen[e].size(), 37u) << "epoch " << e;
    EXPECT_EQ(std::set<int64_t>(seen[e].begin(), seen[e].end()).size(), 37u);
  }
  // Commit through the end of the data and read the ledger.
  for (int r = 0; r < 2; ++r) ASSERT_TRUE((*engine)->Ack(r, "s" + std::to_string(r), {}, Cursor{2, 0}).ok());
  LedgerReport rep = (*engine)->ledger_report();
  EXPECT_EQ(rep.epochs, 2);
  EXPECT_EQ(rep.committed_samples, 74);
  EXPECT_EQ(rep.samples_committed_twice, 0);
  EXPECT_EQ(rep.samples_never_committed, 0);
  EXPECT_EQ(rep.redeliveries, 0);
  EXPECT_EQ((*engine)->stats().buffered_batches, 0);
}

TEST(EngineTest, ResubscribingWithACursorRedeliversUncommittedBatches) {
  testing::EngineWorld w = testing::MakeEngineWorld(30, /*seed=*/3);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), SmallBatches());
  ASSERT_TRUE(engine.ok());
  SubscribeParams p;
  p.subscriber_id = "first";
  p.credit_window = 3;
  uint64_t g1 = *(*engine)->Subscribe(p);
  ReadyBatch b0 = testing::NextBatch(**engine, 0, g1), b1 = testing::NextBatch(**engine, 0, g1), b2 = testing::NextBatch(**engine, 0, g1);
  // Trained b0 and b1 and checkpointed after b0 only; then the student dies.
  ASSERT_TRUE((*engine)->Ack(0, "first", {b0.batch_id, b1.batch_id}, Cursor{0, 1}).ok());
  (*engine)->Detach(0, g1);
  // The restarted student resumes from its checkpoint's cursor.
  p.subscriber_id = "second";
  p.resume = {0, 1};
  uint64_t g2 = *(*engine)->Subscribe(p);
  EXPECT_FALSE((*engine)->TakeNext(0, g1).ok());  // the old subscription is superseded
  ReadyBatch again1 = testing::NextBatch(**engine, 0, g2), again2 = testing::NextBatch(**engine, 0, g2);
  EXPECT_EQ(again1.index, 1);
  EXPECT_EQ(again1.sample_ids, b1.sample_ids);
  EXPECT_EQ(again2.sample_ids, b2.sample_ids);
  // Identical bytes: the batch is recomputed deterministically.
  EXPECT_EQ(again1.payload->total_bytes(), b1.payload->total_bytes());
  // The stale student can no longer ack.
  EXPECT_FALSE((*engine)->Ack(0, "first", {b2.batch_id}, std::nullopt).ok());
  ASSERT_TRUE((*engine)->Ack(0, "second", {again1.batch_id, again2.batch_id}, Cursor{0, 3}).ok());
  LedgerReport rep = (*engine)->ledger_report();
  EXPECT_EQ(rep.redeliveries, 2);
  EXPECT_EQ(rep.samples_committed_twice, 0);
  EXPECT_EQ(rep.committed_samples,
            static_cast<int64_t>(b0.sample_ids.size() + b1.sample_ids.size() + b2.sample_ids.size()));
}

// scancel signals teacher and students at once: the drain waits for the
// final commit of each attached rank that holds batches beyond its commit,
// and for no one else.
TEST(EngineTest, DrainWaitsForTheFinalCommitOfRanksWithUncommittedBatches) {
  testing::EngineWorld w = testing::MakeEngineWorld(30, /*seed=*/3);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), SmallBatches());
  ASSERT_TRUE(engine.ok());
  uint64_t g0 = SubscribeRank(**engine, 0, 2, "busy");
  uint64_t g1 = SubscribeRank(**engine, 1, 2, "idle");
  // Rank 0 trained two batches and checkpointed after the first; rank 1
  // trained and committed everything it took.
  ReadyBatch a0 = testing::NextBatch(**engine, 0, g0), a1 = testing::NextBatch(**engine, 0, g0);
  ASSERT_TRUE((*engine)->Ack(0, "busy", {a0.batch_id}, Cursor{0, 1}).ok());
  ASSERT_TRUE((*engine)->Ack(0, "busy", {a1.batch_id}, std::nullopt).ok());
  ReadyBatch b0 = testing::NextBatch(**engine, 1, g1);
  ASSERT_TRUE((*engine)->Ack(1, "idle", {b0.batch_id}, Cursor{0, 1}).ok());
  EXPECT_TRUE((*engine)->DrainSettled()) << "nothing to wait for before a drain";

  (*engine)->Drain();
  EXPECT_EQ((*engine)->DrainPending(), 1);
  EXPECT_EQ((*engine)->DrainWaitedRanks(), 1) << "rank 1 had committed all it took";
  EXPECT_FALSE((*engine)->DrainSettled());
  // Acks are still taken while draining; the final checkpoint's commit
  // settles rank 0, and the ledger records it.
  ASSERT_TRUE((*engine)->Ack(0, "busy", {}, Cursor{0, 2}).ok());
  EXPECT_TRUE((*engine)->DrainSettled());
  EXPECT_EQ((*engine)->ledger_report().committed_batches, 3);
}

// The student may stop before the teacher does (the same scancel reaches
// it first): its final report, marked as such, settles its rank even when
// it arrives before the drain begins. An unmarked commit before the drain
// does not (the rank may still checkpoint what it holds), and a new
// subscription starts without the mark.
TEST(EngineTest, AFinalReportBeforeTheDrainSettlesItsRank) {
  testing::EngineWorld w = testing::MakeEngineWorld(30, /*seed=*/3);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), SmallBatches());
  ASSERT_TRUE(engine.ok());
  uint64_t g0 = SubscribeRank(**engine, 0, 2, "early");
  uint64_t g1 = SubscribeRank(**engine, 1, 2, "plain");
  // Each rank trained one batch and holds a second it will not train.
  ReadyBatch a0 = testing::NextBatch(**engine, 0, g0);
  (void)testing::NextBatch(**engine, 0, g0);
  ReadyBatch b0 = testing::NextBatch(**engine, 1, g1);
  (void)testing::NextBatch(**engine, 1, g1);
  ASSERT_TRUE((*engine)->Ack(FinalReport(0, "early", g0, {a0.batch_id}, Cursor{0, 1})).ok());
  ASSERT_TRUE((*engine)->Ack(1, "plain", {b0.batch_id}, Cursor{0, 1}).ok());

  (*engine)->Drain();
  EXPECT_EQ((*engine)->DrainPending(), 1) << "rank 1's commit was not its last word; rank 0's was";
  EXPECT_EQ((*engine)->DrainWaitedRanks(), 2) << "both ranks held a batch they had not committed";
  ASSERT_TRUE((*engine)->Ack(FinalReport(1, "plain", g1, {}, Cursor{0, 1})).ok());
  EXPECT_TRUE((*engine)->DrainSettled());
  EXPECT_EQ((*engine)->ledger_report().committed_batches, 2);
}

TEST(EngineTest, ANewSubscriptionStartsWithoutTheFinalReport) {
  testing::EngineWorld w = testing::MakeEngineWorld(30, /*seed=*/3);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), SmallBatches());
  ASSERT_TRUE(engine.ok());
  uint64_t g = SubscribeRank(**engine, 0, 1, "first");
  ReadyBatch a0 = testing::NextBatch(**engine, 0, g);
  ASSERT_TRUE((*engine)->Ack(FinalReport(0, "first", g, {a0.batch_id}, Cursor{0, 1})).ok());
  (*engine)->Detach(0, g);
  // Resumed from its checkpoint, it takes a batch and has not reported on it.
  g = SubscribeRank(**engine, 0, 1, "second", Cursor{0, 1});
  (void)testing::NextBatch(**engine, 0, g);
  (*engine)->Drain();
  EXPECT_EQ((*engine)->DrainPending(), 1);
}

TEST(EngineTest, CreditWindowBoundsWorkAhead) {
  testing::EngineWorld w = testing::MakeEngineWorld(40, /*seed=*/3);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), SmallBatches());
  ASSERT_TRUE(engine.ok());
  SubscribeParams p;
  p.subscriber_id = "slow";
  p.credit_window = 2;
  uint64_t g = *(*engine)->Subscribe(p);
  auto buffered = [&] { return (*engine)->stats().buffered_batches; };
  ASSERT_TRUE(WaitFor([&] { return buffered() == 2; }));  // computed ahead...
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(buffered(), 2);  // ...then stopped at the window
  ReadyBatch b = testing::NextBatch(**engine, 0, g);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(buffered(), 2);  // taken but unacked still counts
  // Read before the ack: the worker may refill the window before this
  // thread runs again.
  const int64_t computed = (*engine)->stats().batches_computed;
  auto credits = (*engine)->Ack(0, "slow", {b.batch_id}, std::nullopt);
  ASSERT_TRUE(credits.ok());
  ASSERT_TRUE(WaitFor([&] { return (*engine)->stats().batches_computed == computed + 1; }));  // refilled
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(buffered(), 2);  // and no further
}

TEST(EngineTest, DeadSubscriberBuffersAreReclaimed) {
  testing::EngineWorld w = testing::MakeEngineWorld(40, /*seed=*/3);
  EngineOptions o = SmallBatches();
  o.subscriber_timeout = absl::Milliseconds(300);
  o.shm_prefix = "/e3reclaim" + std::to_string(::getpid());
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), o);
  ASSERT_TRUE(engine.ok());
  SubscribeParams p;
  p.subscriber_id = "doomed";
  p.credit_window = 4;
  p.transport = TransportKind::kShm;
  uint64_t g = *(*engine)->Subscribe(p);
  {
    ReadyBatch b = testing::NextBatch(**engine, 0, g);  // taken, never acked
    (void)b;
  }
  ASSERT_TRUE(WaitFor([&] { return (*engine)->stats().buffered_batches == 4; }));
  EXPECT_EQ(CountShmSegments(o.shm_prefix), 4);
  (*engine)->Detach(0, g);  // the stream died
  ASSERT_TRUE(WaitFor([&] { return (*engine)->stats().buffered_batches == 0; }));
  EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.buffered_batches, 0);
  EXPECT_EQ(s.buffered_bytes, 0);
  EXPECT_EQ(s.reclaimed_batches, 4);
  EXPECT_EQ(CountShmSegments(o.shm_prefix), 0);  // unlinked, not leaked
}

TEST(EngineTest, InconsistentSubscriptionsAreRefused) {
  testing::EngineWorld w = testing::MakeEngineWorld(10, /*seed=*/3);
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), SmallBatches());
  ASSERT_TRUE(engine.ok());
  SubscribeParams p;
  p.subscriber_id = "a";
  p.world_size = 2;
  ASSERT_TRUE((*engine)->Subscribe(p).ok());
  p.rank = 1;
  p.world_size = 4;
  auto bad = (*engine)->Subscribe(p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("world of 2"), std::string::npos) << bad.status();
  p.rank = 2;
  p.world_size = 2;
  EXPECT_FALSE((*engine)->Subscribe(p).ok());
  EngineOptions o = SmallBatches();
  o.aux_layer_ids = {9};
  EXPECT_FALSE(Engine::Create(w.model.get(), w.dataset.get(), o).ok());
}

// A scratch directory for a ledger, removed with the test.
struct LedgerDir {
  std::string path = MakeTempDir("engine_ledger_").value();
  ~LedgerDir() { (void)RemoveAll(path); }
  // SmallBatches() writing its ledger here.
  EngineOptions Options() const {
    EngineOptions o = SmallBatches();
    o.ledger_path = JoinPath(path, "ledger.jsonl");
    return o;
  }
};

// A checkpoint whose cursor was edited, or that belongs to another run,
// names batches the rank was never sent: refused, in this process and
// after a restart on the same ledger.
TEST(EngineTest, AResumeCursorPastEveryDeliveryIsRefused) {
  testing::EngineWorld w = testing::MakeEngineWorld(30, /*seed=*/3);
  const LedgerDir ledger;
  EngineOptions o = ledger.Options();
  {
    auto engine = Engine::Create(w.model.get(), w.dataset.get(), o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const uint64_t g = SubscribeRank(**engine, 0, 1, "s");
    ReadyBatch b0 = testing::NextBatch(**engine, 0, g), b1 = testing::NextBatch(**engine, 0, g);
    ASSERT_TRUE((*engine)->Ack(0, "s", {b0.batch_id, b1.batch_id}, Cursor{0, 2}).ok());
    SubscribeParams p;
    p.subscriber_id = "s";
    p.resume = {0, 9};
    auto edited = (*engine)->Subscribe(p);
    ASSERT_FALSE(edited.ok());
    EXPECT_EQ(edited.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(edited.status().message().find("past every batch this teacher delivered to rank 0 (up to 0:2)"),
              std::string::npos)
        << edited.status();
  }
  auto restarted = Engine::Create(w.model.get(), w.dataset.get(), o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  SubscribeParams p;
  p.subscriber_id = "s";
  p.resume = {0, 9};
  EXPECT_FALSE((*restarted)->Subscribe(p).ok());
  p.resume = {0, 2};
  EXPECT_TRUE((*restarted)->Subscribe(p).ok());
}

// The launcher passes its student count: a subscriber claiming another
// world is refused, and a ledger of another world is not reused.
TEST(EngineTest, AConfiguredWorldRefusesAnyOther) {
  testing::EngineWorld w = testing::MakeEngineWorld(12, /*seed=*/3);
  const LedgerDir ledger;
  EngineOptions o = ledger.Options();
  o.student_world_size = 1;
  {
    auto engine = Engine::Create(w.model.get(), w.dataset.get(), o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    SubscribeParams p;
    p.subscriber_id = "intruder";
    p.world_size = 20;
    auto refused = (*engine)->Subscribe(p);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("world of 1 student ranks (--student_world_size)"), std::string::npos)
        << refused.status();
    const uint64_t g = SubscribeRank(**engine, 0, 1, "real");
    ReadyBatch b = testing::NextBatch(**engine, 0, g);
    ASSERT_TRUE((*engine)->Ack(0, "real", {b.batch_id}, Cursor{0, 1}).ok());
  }
  o.student_world_size = 2;
  auto other = Engine::Create(w.model.get(), w.dataset.get(), o);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("records a world of 1 student ranks"), std::string::npos) << other.status();
}

// Subscribers that never committed do not fix the world of a restarted
// teacher: twenty fake ranks cannot lock the real one out for good.
TEST(EngineTest, AWorldNoCommitConfirmedIsNotRestored) {
  testing::EngineWorld w = testing::MakeEngineWorld(12, /*seed=*/3);
  const LedgerDir ledger;
  EngineOptions o = ledger.Options();
  {
    auto engine = Engine::Create(w.model.get(), w.dataset.get(), o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    SubscribeRank(**engine, 3, 20, "fake");
    EXPECT_FALSE((*engine)->Subscribe(SubscribeParams{}).ok()) << "the world of this process is 20";
  }
  auto restarted = Engine::Create(w.model.get(), w.dataset.get(), o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  SubscribeParams p;
  p.subscriber_id = "real";
  EXPECT_TRUE((*restarted)->Subscribe(p).ok());
}

// A ledger that cannot be written stops the commit path with an error
// naming it; nothing is counted that the file lacks, and commits resume
// once it can be written.
TEST(EngineTest, ALedgerThatCannotBeWrittenStopsCommitsUntilItCan) {
  testing::EngineWorld w = testing::MakeEngineWorld(20, /*seed=*/3);
  const LedgerDir ledger;
  EngineOptions o = ledger.Options();
  auto engine = Engine::Create(w.model.get(), w.dataset.get(), o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const uint64_t g = SubscribeRank(**engine, 0, 1, "s");
  ReadyBatch b0 = testing::NextBatch(**engine, 0, g), b1 = testing::NextBatch(**engine, 0, g);
  ASSERT_TRUE((*engine)->Ack(0, "s", {b0.batch_id}, Cursor{0, 1}).ok());
  const int64_t size = static_cast<int64_t>(ReadFileToString(o.ledger_path).value().size());
  {
    testing::FileSizeLimit full(static_cast<rlim_t>(size));
    ASSERT_TRUE(full.ok());
    auto refused = (*engine)->Ack(0, "s", {b1.batch_id}, Cursor{0, 2});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(refused.status().message().find(o.ledger_path), std::string::npos) << refused.status();
    EXPECT_EQ((*engine)->ledger_report().committed_batches, 1);
  }
  EXPECT_FALSE((*engine)->ledger_failure().ok());
  ASSERT_TRUE((*engine)->Ack(0, "s", {}, Cursor{0, 2}).ok());
  const LedgerReport r = (*engine)->ledger_report();
  EXPECT_EQ(r.committed_batches, 2);
  EXPECT_EQ(r.samples_committed_twice, 0);
  engine->reset();  // closes the ledger before its directory goes
}

}  // namespace
}  // namespace e3
