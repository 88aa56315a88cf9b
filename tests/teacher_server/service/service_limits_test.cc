// What a hostile or broken peer can make the teacher do, on a real
// TeacherService over loopback with a small real model
// (tests/fixtures/golden/rand_default_mha, vocab 256, hidden 64): each
// request past a limit is refused with a status that names the field or
// the cap, and afterwards the same engine still serves an honest student.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/vocab_map.h"
#include "common/model/model_dir.h"
#include "proto/subscription_wire.h"
#include "proto/wire_codec.h"
#include "teacher_server/engine/student_groups.h"
#include "teacher_server/service/teacher_service.h"
#include "tests/teacher_server/loopback_teacher.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

void SetLimitsDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + 20s);
}

class ServiceLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { m_ = testing::LoadLoopbackModel(40, 3, 100).release(); }
  static void TearDownTestSuite() { delete m_; }

  // A teacher with the given caps and a stub whose own caps are generous,
  // so that the server's are the ones tested.
  std::unique_ptr<testing::LoopbackTeacher> Start(ServiceOptions sopts) {
    EngineOptions eopts;
    eopts.tokens_per_batch = 120;
    eopts.aux_layer_ids = {0, 2, 4};
    eopts.transports = {TransportKind::kInline};
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    return testing::StartLoopbackTeacher(*m_, eopts, sopts, nullptr, args);
  }

  static v1::SubscribeRequest Subscribe(const std::string& id, int rank, int world) {
    v1::SubscribeRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    req.set_subscriber_id(id);
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_credit_window(2);
    req.add_accepted_transports(v1::TRANSPORT_INLINE);
    return req;
  }

  // The stream's first message, or its final status when there is none.
  static grpc::Status FirstBatch(v1::TeacherService::Stub& stub, const v1::SubscribeRequest& req,
                                 v1::BatchDescriptor* first, uint64_t* generation = nullptr) {
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    auto reader = stub.Subscribe(&ctx, req);
    if (reader->Read(first)) {
      if (generation != nullptr) {
        const auto& md = ctx.GetServerInitialMetadata();
        auto it = md.find(kSubscriptionGenerationKey);
        if (it != md.end()) {
          *generation =
              ParseSubscriptionGeneration(std::string(it->second.data(), it->second.size())).value_or(0);
        }
      }
      ctx.TryCancel();
      reader->Finish();
      return grpc::Status::OK;
    }
    return reader->Finish();
  }

  static grpc::Status Generate(v1::TeacherService::Stub& stub, const std::vector<int32_t>& prompt,
                               int max_new, v1::GenerateResponse* resp) {
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    v1::GenerateRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    for (int32_t id : prompt) req.add_input_ids(id);
    req.set_max_new_tokens(max_new);
    return stub.Generate(&ctx, req, resp);
  }

  // An honest student still gets its first batch and its ack is taken.
  static void ExpectServesAnHonestStudent(testing::LoopbackTeacher& t) {
    v1::BatchDescriptor d;
    uint64_t generation = 0;
    grpc::Status st = FirstBatch(*t.stub, Subscribe("honest", 0, 1), &d, &generation);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(d.index_in_epoch(), 0);
    EXPECT_GT(d.num_tokens(), 0);
    auto rb = ReceivedBatch::Resolve(d, t.engine->shm_segment_prefix());
    ASSERT_TRUE(rb.ok()) << rb.status();
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    v1::AckRequest ack;
    ack.set_version(v1::PROTOCOL_VERSION_CURRENT);
    ack.set_subscriber_id("honest");
    ack.set_subscription_generation(generation);
    ack.add_batch_ids(d.batch_id());
    v1::AckResponse resp;
    st = t.stub->Ack(&ctx, ack, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(t.engine->world_size(), 1);
  }

  static void ExpectStatus(const grpc::Status& st, grpc::StatusCode code,
                           const std::string& message) {
    EXPECT_EQ(st.error_code(), code) << st.error_message();
    EXPECT_NE(st.error_message().find(message), std::string::npos) << st.error_message();
  }

  static inline testing::LoopbackModel* m_ = nullptr;
};

TEST_F(ServiceLimitsTest, RankAndWorldOutsideTheBoundsAreRefused) {
  auto t = Start(ServiceOptions{});
  ASSERT_NE(t, nullptr);
  v1::BatchDescriptor d;
  // Rank 10000 of 10001: the rank that made batch ids collide with rank 0's.
  ExpectStatus(FirstBatch(*t->stub, Subscribe("big", 10000, 10001), &d),
               grpc::StatusCode::INVALID_ARGUMENT,
               "SubscribeRequest.world_size is 10001; expected 1 <= world_size <= 10000");
  ExpectStatus(FirstBatch(*t->stub, Subscribe("r", 4, 4), &d), grpc::StatusCode::INVALID_ARGUMENT,
               "SubscribeRequest.rank is 4; expected 0 <= rank < world_size 4");
  ExpectStatus(FirstBatch(*t->stub, Subscribe("n", -1, 2), &d), grpc::StatusCode::INVALID_ARGUMENT,
               "SubscribeRequest.rank is -1");
  ExpectStatus(FirstBatch(*t->stub, Subscribe("quote\"id", 0, 1), &d),
               grpc::StatusCode::INVALID_ARGUMENT, "SubscribeRequest.subscriber_id has byte 0x22");
  v1::SubscribeRequest rewind = Subscribe("neg", 0, 1);
  rewind.mutable_resume()->set_epoch(-3);
  ExpectStatus(FirstBatch(*t->stub, rewind, &d), grpc::StatusCode::INVALID_ARGUMENT,
               "SubscribeRequest.resume");
  {
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    v1::GetInfoRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    req.set_world_size(2000000000);
    v1::GetInfoResponse resp;
    ExpectStatus(t->stub->GetInfo(&ctx, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "GetInfoRequest.world_size is 2000000000");
  }
  {
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    v1::AckRequest ack;
    ack.set_version(v1::PROTOCOL_VERSION_CURRENT);
    ack.set_subscriber_id("big");
    ack.set_rank(123456);
    v1::AckResponse resp;
    ExpectStatus(t->stub->Ack(&ctx, ack, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                 "AckRequest.rank is 123456");
  }
  // Nothing above fixed the engine's world or reached its ledger.
  EXPECT_EQ(t->engine->world_size(), 0);
  EXPECT_EQ(t->engine->stats().batches_computed, 0);
  ExpectServesAnHonestStudent(*t);
}

TEST_F(ServiceLimitsTest, TheLargestWorldKeepsBatchIdsApart) {
  // Rank 9999 of 10000 and rank 0 both subscribe: with 40 samples only
  // the low ranks get any, but every rank's batch has its own id.
  auto t = Start(ServiceOptions{});
  ASSERT_NE(t, nullptr);
  v1::BatchDescriptor last, first;
  ASSERT_TRUE(
      FirstBatch(*t->stub, Subscribe("last", kMaxWorldSize - 1, kMaxWorldSize), &last).ok());
  ASSERT_TRUE(FirstBatch(*t->stub, Subscribe("first", 0, kMaxWorldSize), &first).ok());
  EXPECT_EQ(last.index_in_epoch(), 0);
  EXPECT_EQ(first.index_in_epoch(), 0);
  EXPECT_EQ(last.num_samples(), 0);
  EXPECT_GT(first.num_samples(), 0);
  EXPECT_NE(first.batch_id(), last.batch_id());
  EXPECT_EQ(t->engine->world_size(), kMaxWorldSize);
}

TEST(BatchIdTest, DistinctAtTheBoundsAndWithinInt64) {
  std::set<int64_t> ids;
  int n = 0;
  for (int64_t epoch : {int64_t{0}, int64_t{1}, kMaxEpochs - 1}) {
    for (int64_t index : {int64_t{0}, int64_t{1}, kMaxBatchesPerEpoch - 1}) {
      for (int rank : {0, 1, kMaxWorldSize - 1}) {
        const int64_t id = BatchIdOf(epoch, index, rank);
        EXPECT_GE(id, 0);
        ids.insert(id);
        ++n;
      }
    }
  }
  EXPECT_EQ(static_cast<int>(ids.size()), n);
}

TEST_F(ServiceLimitsTest, EpochsPastTheBatchIdRangeAreRefused) {
  EngineOptions eopts;
  eopts.epochs = kMaxEpochs + 1;
  auto engine = Engine::Create(m_->model.get(), m_->dataset.get(), eopts);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("epochs is 900001; expected 1 <= epochs <= 900000"),
            std::string::npos)
      << engine.status();
}

TEST_F(ServiceLimitsTest, GenerateIsBoundedInPromptAndNewTokens) {
  ServiceOptions sopts;
  sopts.max_generate_tokens = 8;
  sopts.max_generate_prompt_tokens = 32;
  auto t = Start(sopts);
  ASSERT_NE(t, nullptr);
  v1::GenerateResponse resp;
  ExpectStatus(Generate(*t->stub, {1, 2, 3}, 9, &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "GenerateRequest.max_new_tokens is 9; expected 1 <= max_new_tokens <= 8 "
               "(--max_generate_new_tokens)");
  ExpectStatus(Generate(*t->stub, {1, 2, 3}, -1, &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "GenerateRequest.max_new_tokens is -1");
  ExpectStatus(Generate(*t->stub, std::vector<int32_t>(33, 5), 4, &resp),
               grpc::StatusCode::INVALID_ARGUMENT,
               "GenerateRequest.input_ids holds 33 tokens; expected at most 32 "
               "(--max_generate_prompt_tokens)");
  ExpectStatus(Generate(*t->stub, {1, 2, 1 << 30}, 4, &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "GenerateRequest.input_ids[2] is 1073741824; expected 0 <= id < vocab_size 256");
  EXPECT_EQ(resp.output_ids_size(), 0);
  // At the caps the call runs.
  grpc::Status st = Generate(*t->stub, std::vector<int32_t>(32, 5), 8, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_GE(resp.output_ids_size(), 1);
  EXPECT_LE(resp.output_ids_size(), 8);
  ExpectServesAnHonestStudent(*t);
}

TEST_F(ServiceLimitsTest, ARequestOverTheReceiveCapIsRefusedByGrpc) {
  ServiceOptions sopts;
  sopts.messages.max_receive_bytes = 64 << 10;
  sopts.max_generate_prompt_tokens = 1 << 20;
  auto t = Start(sopts);
  ASSERT_NE(t, nullptr);
  v1::GenerateResponse resp;
  // 40000 ids of 2-byte varints: about 80 KB, over 64 KiB.
  ExpectStatus(Generate(*t->stub, std::vector<int32_t>(40000, 200), 1, &resp),
               grpc::StatusCode::RESOURCE_EXHAUSTED, "larger than max");
  {
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    v1::AckRequest ack;
    ack.set_version(v1::PROTOCOL_VERSION_CURRENT);
    ack.set_subscriber_id("flood");
    for (int i = 0; i < 20000; ++i) ack.add_batch_ids(int64_t{1} << 40);
    v1::AckResponse aresp;
    ExpectStatus(t->stub->Ack(&ctx, ack, &aresp), grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "larger than max");
  }
  {
    // Under the byte cap, over the id cap: the handler refuses it.
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    v1::AckRequest ack;
    ack.set_version(v1::PROTOCOL_VERSION_CURRENT);
    ack.set_subscriber_id("flood");
    for (int i = 0; i < 5000; ++i) ack.add_batch_ids(i);
    v1::AckResponse aresp;
    ExpectStatus(t->stub->Ack(&ctx, ack, &aresp), grpc::StatusCode::INVALID_ARGUMENT,
                 "AckRequest.batch_ids holds 5000 ids; expected at most 4096");
  }
  {
    grpc::ClientContext ctx;
    SetLimitsDeadline(&ctx);
    v1::GetWeightsRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    for (int i = 0; i < 100; ++i) req.add_names("embed_tokens");
    auto reader = t->stub->GetWeights(&ctx, req);
    v1::WeightChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    ExpectStatus(reader->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                 "GetWeightsRequest.names holds 100 names; expected at most 16");
  }
  ExpectServesAnHonestStudent(*t);
}

TEST_F(ServiceLimitsTest, ABatchOverTheSendCapEndsTheStreamNamingTheFlag) {
  // An inline batch here is about 120 KB; the weights still stream, in
  // chunks of half the cap.
  ServiceOptions sopts;
  sopts.messages.max_send_bytes = 64 << 10;
  auto t = Start(sopts);
  ASSERT_NE(t, nullptr);
  v1::BatchDescriptor d;
  ExpectStatus(FirstBatch(*t->stub, Subscribe("s", 0, 1), &d),
               grpc::StatusCode::FAILED_PRECONDITION,
               "over the teacher's --max_send_message_bytes=65536");
  grpc::ClientContext ctx;
  SetLimitsDeadline(&ctx);
  v1::GetWeightsRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  auto reader = t->stub->GetWeights(&ctx, req);
  v1::WeightChunk chunk;
  uint64_t bytes = 0;
  while (reader->Read(&chunk)) {
    EXPECT_LE(chunk.ByteSizeLong(), 64u << 10);
    bytes += chunk.tensor().inline_data().size();
  }
  grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_GT(bytes, 64u << 10);
}

TEST_F(ServiceLimitsTest, CapsOutsideGrpcsRangeAreRefusedAtStart) {
  EngineOptions eopts;
  eopts.aux_layer_ids = {0, 2, 4};
  auto groups = StudentGroups::Create(m_->model.get(), m_->dataset.get(), eopts, {});
  ASSERT_TRUE(groups.ok()) << groups.status();
  TeacherMetrics metrics;
  ServiceOptions sopts;
  sopts.messages.max_send_bytes = int64_t{3} << 30;
  auto service =
      TeacherServiceImpl::Create(groups->get(), m_->model.get(), m_->vocab.get(), m_->dataset.get(), &metrics, sopts);
  ASSERT_FALSE(service.ok());
  EXPECT_NE(service.status().message().find("--max_send_message_bytes is 3221225472"),
            std::string::npos)
      << service.status();
}

}  // namespace
}  // namespace e3
