// Feature subscriptions over a real gRPC server on loopback: GetInfo tells
// what the teacher captures and which student groups it serves; a
// Subscribe asking for some layers gets descriptors holding only its
// tensors, its aux states the captured ones' slice; a layer not captured
// and a group not served are refused with FAILED_PRECONDITION naming
// them; the eval set comes sliced the same way; and two groups each get
// the whole stream, acked in their own group.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/subscription_wire.h"
#include "proto/wire_codec.h"
#include "teacher_server/data/eval_set.h"
#include "teacher_server/runtime/serialized_model.h"
#include "teacher_server/service/teacher_service.h"
#include "tests/teacher_server/loopback_teacher.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

class FeatureSubscriptionsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { m_ = testing::LoadLoopbackModel(24, 9, 100).release(); }
  static void TearDownTestSuite() { delete m_; }

  std::unique_ptr<testing::LoopbackTeacher> StartTeacher(const std::vector<std::string>& groups = {}) {
    EngineOptions o;
    o.tokens_per_batch = 120;
    o.aux_layer_ids = {0, 2, 4};
    o.transports = {TransportKind::kInline};
    o.shm_prefix = absl::StrCat("/e3featsvc", ::getpid());
    return testing::StartLoopbackTeacher(*m_, o, {}, nullptr, {}, groups);
  }

  static v1::SubscribeRequest Subscription(const std::string& id, const std::string& group = "") {
    v1::SubscribeRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    req.set_subscriber_id(id);
    req.set_world_size(1);
    req.set_credit_window(2);
    req.add_accepted_transports(v1::TRANSPORT_INLINE);
    req.set_student_group(group);
    return req;
  }

  static std::unique_ptr<grpc::ClientContext> Deadline() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + 20s);
    return ctx;
  }

  static inline testing::LoopbackModel* m_ = nullptr;
};

std::vector<std::string> Names(const v1::BatchDescriptor& d) {
  std::vector<std::string> names;
  for (const auto& t : d.tensors()) names.push_back(t.name());
  return names;
}

at::Tensor AuxOf(const ReceivedBatch& rb, int64_t layers) {
  auto aux = rb.Get("aux_hidden");
  EXPECT_TRUE(aux.ok()) << aux.status();
  if (!aux.ok()) return at::Tensor();
  EXPECT_EQ(aux->shape, (std::vector<int64_t>{aux->shape[0], layers * 64}));
  return torch::from_blob(const_cast<uint8_t*>(aux->data), {aux->shape[0], layers * 64}, torch::kFloat).clone();
}

TEST_F(FeatureSubscriptionsTest, GetInfoTellsWhatIsCapturedAndWhichGroupsAreServed) {
  auto t = StartTeacher({"dflash"});
  ASSERT_NE(t, nullptr);
  auto ctx = Deadline();
  v1::GetInfoRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::GetInfoResponse resp;
  ASSERT_TRUE(t->stub->GetInfo(ctx.get(), req, &resp).ok());
  ASSERT_TRUE(resp.has_captured());
  const FeatureRequest captured = FeatureRequestFromWire(resp.captured());
  EXPECT_EQ(captured.aux_layer_ids, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_TRUE(captured.last_hidden);
  EXPECT_TRUE(captured.target_argmax);
  ASSERT_EQ(resp.student_groups_size(), 1);
  EXPECT_EQ(resp.student_groups(0), "dflash");
}

TEST_F(FeatureSubscriptionsTest, ASubscriberReceivesOnlyItsLayersAndTensors) {
  auto t = StartTeacher();
  ASSERT_NE(t, nullptr);
  // Everything (an older student), then layers [4, 2] and the argmax, of
  // the same first batch.
  auto all_ctx = Deadline();
  auto all_reader = t->stub->Subscribe(all_ctx.get(), Subscription("everything"));
  v1::BatchDescriptor all;
  ASSERT_TRUE(all_reader->Read(&all)) << all_reader->Finish().error_message();
  all_ctx->TryCancel();
  (void)all_reader->Finish();

  v1::SubscribeRequest req = Subscription("dflash-like");
  req.mutable_features()->add_aux_layer_ids(4);
  req.mutable_features()->add_aux_layer_ids(2);
  req.mutable_features()->set_target_argmax(true);
  auto ctx = Deadline();
  auto reader = t->stub->Subscribe(ctx.get(), req);
  v1::BatchDescriptor mine;
  ASSERT_TRUE(reader->Read(&mine)) << reader->Finish().error_message();
  EXPECT_EQ(Names(all), (std::vector<std::string>{"input_ids", "cu_seqlens", "loss_mask", "aux_hidden", "last_hidden",
                                                  "target_argmax"}));
  EXPECT_EQ(Names(mine),
            (std::vector<std::string>{"input_ids", "cu_seqlens", "loss_mask", "aux_hidden", "target_argmax"}));
  ASSERT_EQ(std::vector<int64_t>(mine.sample_ids().begin(), mine.sample_ids().end()),
            std::vector<int64_t>(all.sample_ids().begin(), all.sample_ids().end()));
  EXPECT_LT(mine.payload_bytes(), all.payload_bytes());
  auto all_rb = ReceivedBatch::Resolve(all, t->engine->shm_segment_prefix());
  auto mine_rb = ReceivedBatch::Resolve(mine, t->engine->shm_segment_prefix());
  ASSERT_TRUE(all_rb.ok() && mine_rb.ok());
  const at::Tensor every = AuxOf(**all_rb, 3), own = AuxOf(**mine_rb, 2);
  EXPECT_TRUE(torch::equal(own.narrow(1, 0, 64), every.narrow(1, 128, 64)));
  EXPECT_TRUE(torch::equal(own.narrow(1, 64, 64), every.narrow(1, 64, 64)));
  ctx->TryCancel();
  (void)reader->Finish();
}

TEST_F(FeatureSubscriptionsTest, ALayerNotCapturedAndAGroupNotServedAreRefused) {
  auto t = StartTeacher({"dflash"});
  ASSERT_NE(t, nullptr);
  v1::SubscribeRequest req = Subscription("wants-layer-1");
  req.mutable_features()->add_aux_layer_ids(1);
  req.mutable_features()->add_aux_layer_ids(2);
  auto ctx = Deadline();
  auto reader = t->stub->Subscribe(ctx.get(), req);
  v1::BatchDescriptor d;
  EXPECT_FALSE(reader->Read(&d));
  grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("does not capture [1]: it captures [0, 2, 4]"), std::string::npos)
      << st.error_message();

  auto ctx2 = Deadline();
  auto reader2 = t->stub->Subscribe(ctx2.get(), Subscription("lost", "medusa"));
  EXPECT_FALSE(reader2->Read(&d));
  st = reader2->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("serves no student group \"medusa\"; it serves the default group and dflash"),
            std::string::npos)
      << st.error_message();
  EXPECT_EQ(t->engine->world_size(), 0) << "a refused subscription fixed the world";
}

// Rank 0 of each group takes the first batch; each acks in its own group,
// and an ack naming the other group reaches another subscription.
TEST_F(FeatureSubscriptionsTest, EachGroupGetsTheWholeStreamAndAcksInIt) {
  auto t = StartTeacher({"dflash"});
  ASSERT_NE(t, nullptr);
  auto a_ctx = Deadline(), b_ctx = Deadline();
  auto a = t->stub->Subscribe(a_ctx.get(), Subscription("eagle-0"));
  auto b = t->stub->Subscribe(b_ctx.get(), Subscription("dflash-0", "dflash"));
  v1::BatchDescriptor da, db;
  ASSERT_TRUE(a->Read(&da)) << a->Finish().error_message();
  ASSERT_TRUE(b->Read(&db)) << b->Finish().error_message();
  EXPECT_EQ(da.index_in_epoch(), 0);
  EXPECT_EQ(db.index_in_epoch(), 0);
  EXPECT_EQ(std::vector<int64_t>(da.sample_ids().begin(), da.sample_ids().end()),
            std::vector<int64_t>(db.sample_ids().begin(), db.sample_ids().end()));
  auto ack = [&](grpc::ClientContext& stream, const std::string& id, const std::string& group, int64_t batch) {
    const auto& md = stream.GetServerInitialMetadata();
    auto it = md.find(kSubscriptionGenerationKey);
    EXPECT_NE(it, md.end());
    v1::AckRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    req.set_subscriber_id(id);
    req.set_student_group(group);
    req.set_subscription_generation(
        ParseSubscriptionGeneration(std::string(it->second.data(), it->second.size())).value_or(0));
    req.add_batch_ids(batch);
    v1::AckResponse resp;
    auto ctx = Deadline();
    return t->stub->Ack(ctx.get(), req, &resp);
  };
  EXPECT_TRUE(ack(*a_ctx, "eagle-0", "", da.batch_id()).ok());
  EXPECT_TRUE(ack(*b_ctx, "dflash-0", "dflash", db.batch_id()).ok());
  const grpc::Status crossed = ack(*b_ctx, "dflash-0", "", db.batch_id());
  EXPECT_EQ(crossed.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << crossed.error_message();
  EXPECT_EQ(t->engine->world_size(), 1);
  a_ctx->TryCancel();
  b_ctx->TryCancel();
  (void)a->Finish();
  (void)b->Finish();
}

TEST_F(FeatureSubscriptionsTest, TheEvalSetComesWithTheStudentsLayers) {
  auto t = StartTeacher();
  ASSERT_NE(t, nullptr);
  SerializedCausalLM serialized(m_->model.get());
  EvalSetOptions eo;
  eo.max_new_tokens = 4;
  eo.aux_layer_ids = {0, 2, 4};
  auto eval = EvalSet::Start(&serialized, {{3, 17, 42}, {7, 8, 9}}, eo);
  t->service->SetEvalSet(eval.get());
  auto fetch = [&](const std::vector<int32_t>* layers, std::vector<v1::EvalSetChunk>* chunks) {
    auto ctx = Deadline();
    v1::GetEvalSetRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    if (layers != nullptr) {
      for (int32_t id : *layers) req.mutable_features()->add_aux_layer_ids(id);
    }
    auto reader = t->stub->GetEvalSet(ctx.get(), req);
    v1::EvalSetChunk chunk;
    chunks->clear();
    while (reader->Read(&chunk)) chunks->push_back(chunk);
    return reader->Finish();
  };
  std::vector<v1::EvalSetChunk> all, mine;
  for (int i = 0; i < 500 && (all.empty() || !all[0].ready()); ++i) {
    ASSERT_TRUE(fetch(nullptr, &all).ok());
    if (!all[0].ready()) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(all[0].ready());
  const std::vector<int32_t> layers = {2};
  ASSERT_TRUE(fetch(&layers, &mine).ok());
  ASSERT_EQ(mine.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    auto a = ReceivedBatch::Resolve(all[i].batch(), t->engine->shm_segment_prefix());
    auto b = ReceivedBatch::Resolve(mine[i].batch(), t->engine->shm_segment_prefix());
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(torch::equal(AuxOf(**b, 1), AuxOf(**a, 3).narrow(1, 64, 64)));
    EXPECT_EQ((*b)->Get("input_ids")->nbytes, (*a)->Get("input_ids")->nbytes);
  }
  const std::vector<int32_t> missing = {5};
  const grpc::Status st = fetch(&missing, &mine);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("does not capture [5]"), std::string::npos) << st.error_message();
  t->service->SetEvalSet(nullptr);
}

}  // namespace
}  // namespace e3
