// What keeps "exactly once" when subscribers and teachers come and go,
// over a real gRPC server on loopback with a real stub (teacher_service_test
// style): a superseded subscriber (same id, same rank) is fenced by its
// generation; a commit past what a subscription was delivered is refused;
// a cursor made under another data fingerprint is refused, naming what
// differs; and a teacher restarted on its ledger continues the record, so
// every sample is committed exactly once across the restart.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/data/vocab_map.h"
#include "common/model/model_dir.h"
#include "proto/subscription_wire.h"
#include "teacher_server/service/teacher_service.h"
#include "tests/teacher_server/loopback_teacher.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

// A Subscribe stream and the generation its acceptance announced.
struct Stream {
  std::unique_ptr<grpc::ClientContext> ctx = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::BatchDescriptor>> reader;
  uint64_t generation = 0;
};

class SubscriptionFencingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { m_ = testing::LoadLoopbackModel(12, 5, 100).release(); }
  static void TearDownTestSuite() { delete m_; }

  EngineOptions Options() const {
    EngineOptions o;
    o.tokens_per_batch = 40;  // several batches from twelve samples
    o.aux_layer_ids = {0, 2, 4};
    o.transports = {TransportKind::kInline};
    o.fingerprint.dataset = "00000000000000aa";
    o.fingerprint.samples = "00000000000000bb";
    o.fingerprint.draft_vocab = "00000000000000cc";
    o.fingerprint.data_seed = 42;
    o.fingerprint.epochs = 1;
    o.fingerprint.num_data_shards = 1;
    o.fingerprint.tokens_per_batch = 40;
    return o;
  }

  std::unique_ptr<testing::LoopbackTeacher> Start(EngineOptions o) {
    return testing::StartLoopbackTeacher(*m_, std::move(o));
  }

  static v1::SubscribeRequest Req(const std::string& id, int64_t epoch = 0, int64_t next = 0) {
    v1::SubscribeRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    req.set_subscriber_id(id);
    req.set_world_size(1);
    req.set_credit_window(2);
    req.add_accepted_transports(v1::TRANSPORT_INLINE);
    req.mutable_resume()->set_epoch(epoch);
    req.mutable_resume()->set_next_batch(next);
    return req;
  }

  static Stream Subscribe(testing::LoopbackTeacher& t, const v1::SubscribeRequest& req) {
    Stream s;
    s.ctx->set_deadline(std::chrono::system_clock::now() + 60s);
    s.reader = t.stub->Subscribe(s.ctx.get(), req);
    s.reader->WaitForInitialMetadata();
    const auto& md = s.ctx->GetServerInitialMetadata();
    auto it = md.find(kSubscriptionGenerationKey);
    if (it != md.end()) {
      s.generation = ParseSubscriptionGeneration(std::string(it->second.data(), it->second.size())).value_or(0);
    }
    return s;
  }

  // One Ack as `id` of `generation`: `batch_ids`, and a commit through
  // {0, next} when next >= 0 ({1, 0} past the last batch).
  static grpc::Status Ack(testing::LoopbackTeacher& t, const std::string& id, uint64_t generation, std::vector<int64_t> batch_ids,
                          int64_t commit_next = -1) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::AckRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    req.set_subscriber_id(id);
    req.set_subscription_generation(generation);
    for (int64_t b : batch_ids) req.add_batch_ids(b);
    if (commit_next >= 0) req.mutable_committed()->set_next_batch(commit_next);
    v1::AckResponse resp;
    return t.stub->Ack(&ctx, req, &resp);
  }

  static inline testing::LoopbackModel* m_ = nullptr;
};

TEST_F(SubscriptionFencingTest, ZombieWithTheSameIdIsFencedByItsGeneration) {
  auto t = Start(Options());
  ASSERT_NE(t, nullptr);
  Stream old_one = Subscribe(*t, Req("rank-0"));
  ASSERT_NE(old_one.generation, 0u) << old_one.reader->Finish().error_message();
  v1::BatchDescriptor d;
  ASSERT_TRUE(old_one.reader->Read(&d));
  const int64_t old_batch = d.batch_id();

  // The same id and rank subscribe again (a restarted student while the
  // old process still runs, frozen or partitioned).
  Stream new_one = Subscribe(*t, Req("rank-0"));
  ASSERT_GT(new_one.generation, old_one.generation);

  // The old subscriber's ack and commit are refused, saying why.
  for (int64_t commit : {-1, 1}) {
    grpc::Status st = Ack(*t, "rank-0", old_one.generation, {old_batch}, commit);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED) << st.error_message();
    EXPECT_NE(st.error_message().find("a newer subscription of the same id exists"), std::string::npos)
        << st.error_message();
  }
  // Its stream ends, superseded.
  while (old_one.reader->Read(&d)) {
  }
  grpc::Status ended = old_one.reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(ended.error_message().find("a newer subscription of the same rank exists"), std::string::npos)
      << ended.error_message();
  EXPECT_EQ(t->engine->ledger_report().committed_batches, 0) << "a zombie's commit reached the ledger";

  // The new subscriber acks and commits what it was delivered, and no more.
  ASSERT_TRUE(new_one.reader->Read(&d));
  ASSERT_EQ(d.index_in_epoch(), 0);
  grpc::Status past = Ack(*t, "rank-0", new_one.generation, {}, 3);
  EXPECT_EQ(past.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(past.error_message().find("never delivered"), std::string::npos) << past.error_message();
  EXPECT_TRUE(Ack(*t, "rank-0", new_one.generation, {d.batch_id()}, 1).ok());
  EXPECT_EQ(t->engine->ledger_report().committed_batches, 1);
  new_one.ctx->TryCancel();
  new_one.reader->Finish();
}

TEST_F(SubscriptionFencingTest, CursorOfAnotherDataStreamIsRefusedNamingWhatDiffers) {
  auto t = Start(Options());
  ASSERT_NE(t, nullptr);
  {
    grpc::ClientContext ctx;
    v1::GetInfoRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::GetInfoResponse resp;
    ASSERT_TRUE(t->stub->GetInfo(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.data_fingerprint().data_seed(), 42u);
    EXPECT_EQ(resp.data_fingerprint().samples(), "00000000000000bb");
  }
  v1::SubscribeRequest req = Req("rank-0", 0, 2);
  DataFingerprint other = Options().fingerprint;
  other.data_seed = 7;
  other.samples = "00000000000000dd";
  *req.mutable_resume_fingerprint() = FingerprintToWire(other);
  Stream refused = Subscribe(*t, req);
  EXPECT_EQ(refused.generation, 0u);
  v1::BatchDescriptor d;
  EXPECT_FALSE(refused.reader->Read(&d));
  grpc::Status st = refused.reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  for (const char* part : {"cursor 0:2", "sample order (--data_seed): cursor 7, teacher 42", "tokenized samples",
                           "00000000000000dd"}) {
    EXPECT_NE(st.error_message().find(part), std::string::npos) << part << " in: " << st.error_message();
  }
  EXPECT_EQ(st.error_message().find("draft vocab"), std::string::npos) << "only what differs: " << st.error_message();

  // The same fingerprint, and none at all (a fresh student), are accepted.
  *req.mutable_resume_fingerprint() = FingerprintToWire(Options().fingerprint);
  Stream same = Subscribe(*t, req);
  EXPECT_NE(same.generation, 0u) << same.reader->Finish().error_message();
  same.ctx->TryCancel();
  same.reader->Finish();
  Stream fresh = Subscribe(*t, Req("rank-0"));
  EXPECT_NE(fresh.generation, 0u) << fresh.reader->Finish().error_message();
  fresh.ctx->TryCancel();
  fresh.reader->Finish();
}

TEST_F(SubscriptionFencingTest, RestartedTeacherContinuesItsLedgerExactlyOnce) {
  auto dir = MakeTempDir("fencing_ledger_");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EngineOptions o = Options();
  o.ledger_path = JoinPath(*dir, "ledger.jsonl");
  int64_t per_epoch = 0;
  {
    // The student takes batches 0..2, checkpoints through batch 1 (its
    // commit reaches the teacher), trains batch 2; then the teacher dies.
    auto t = Start(o);
    ASSERT_NE(t, nullptr);
    per_epoch = t->engine->batches_per_epoch(1);
    ASSERT_GE(per_epoch, 4);
    Stream s = Subscribe(*t, Req("rank-0"));
    ASSERT_NE(s.generation, 0u);
    v1::BatchDescriptor d;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(s.reader->Read(&d));
      ASSERT_TRUE(Ack(*t, "rank-0", s.generation, {d.batch_id()}).ok());
    }
    ASSERT_TRUE(Ack(*t, "rank-0", s.generation, {}, 2).ok());
    s.ctx->TryCancel();
    s.reader->Finish();
  }
  // The restarted teacher reads its ledger back: batches 0 and 1 are
  // committed. The student resubscribes after what it consumed (batch 2
  // is in its weights but not yet in a checkpoint).
  auto t = Start(o);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->engine->world_size(), 1) << "the world comes back from the ledger";
  Stream s = Subscribe(*t, Req("rank-0", 0, 3));
  ASSERT_NE(s.generation, 0u) << s.reader->Finish().error_message();
  v1::BatchDescriptor d;
  int64_t next = 3;
  while (s.reader->Read(&d) && !d.end_of_data()) {
    EXPECT_EQ(d.index_in_epoch(), next) << "delivered out of order, or again";
    next = d.index_in_epoch() + 1;
    ASSERT_TRUE(Ack(*t, "rank-0", s.generation, {d.batch_id()}).ok());
  }
  EXPECT_EQ(next, per_epoch);
  // The last checkpoint covers the whole epoch, batch 2 included.
  ASSERT_TRUE(Ack(*t, "rank-0", s.generation, {}, per_epoch).ok());
  s.reader->Finish();
  LedgerReport r = t->engine->ledger_report();
  EXPECT_EQ(r.epochs, 1);
  EXPECT_EQ(r.committed_batches, per_epoch);
  EXPECT_EQ(r.committed_samples, m_->dataset->size());
  EXPECT_EQ(r.samples_committed_twice, 0);
  EXPECT_EQ(r.samples_never_committed, 0);
  (void)RemoveAll(*dir);
}

TEST_F(SubscriptionFencingTest, SubscribeCarriesACommitTheTeacherMissed) {
  auto dir = MakeTempDir("fencing_missed_");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EngineOptions o = Options();
  o.ledger_path = JoinPath(*dir, "ledger.jsonl");
  {
    auto t = Start(o);
    ASSERT_NE(t, nullptr);
    Stream s = Subscribe(*t, Req("rank-0"));
    v1::BatchDescriptor d;
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(s.reader->Read(&d));
    s.ctx->TryCancel();
    s.reader->Finish();
    // The student checkpoints through batch 1, but the teacher is gone
    // before its commit arrives.
  }
  auto t = Start(o);
  ASSERT_NE(t, nullptr);
  v1::SubscribeRequest req = Req("rank-0", 0, 2);
  req.mutable_committed()->set_next_batch(2);
  Stream s = Subscribe(*t, req);
  ASSERT_NE(s.generation, 0u) << s.reader->Finish().error_message();
  EXPECT_EQ(t->engine->ledger_report().committed_batches, 2);
  // A commit the teacher already has is not recorded twice.
  EXPECT_TRUE(Ack(*t, "rank-0", s.generation, {}, 2).ok());
  EXPECT_EQ(t->engine->ledger_report().committed_batches, 2);
  EXPECT_EQ(t->engine->ledger_report().samples_committed_twice, 0);
  s.ctx->TryCancel();
  s.reader->Finish();
  (void)RemoveAll(*dir);
}

}  // namespace
}  // namespace e3
