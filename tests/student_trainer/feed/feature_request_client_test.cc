// The student's side of a feature request, against a scripted teacher on
// loopback (the client is under test): the request is checked against
// what GetInfo says the teacher captures before anything streams, the
// client's info and fingerprint then describe what it receives, a group
// the teacher does not serve stops it at connect, an older teacher (no
// `captured`) is accepted only when it sends exactly the draft's layers,
// and a batch whose aux states are not the draft's width is refused.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "proto/subscription_wire.h"
#include "student_trainer/feed/teacher_client.h"

namespace e3 {
namespace {

constexpr int64_t kPlanHidden = 256;

struct Script {
  bool older = false;       // no `captured`, no groups: a teacher before feature requests
  int64_t sent_layers = 2;  // aux layers in the one batch it sends
  std::vector<std::string> groups;
};

Script ServingGroups(std::vector<std::string> groups) {
  Script s;
  s.groups = std::move(groups);
  return s;
}

Script Sending(int64_t layers, bool older) {
  Script s;
  s.sent_layers = layers;
  s.older = older;
  return s;
}

class PlanTeacher final : public v1::TeacherService::Service {
 public:
  explicit PlanTeacher(Script script) : script_(std::move(script)) {
    config_json_ = ReadFileToString(std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama/config.json").value();
  }

  grpc::Status GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*, v1::GetInfoResponse* resp) override {
    resp->set_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::ModelInfo* m = resp->mutable_model();
    m->set_hidden_size(kPlanHidden);
    m->set_vocab_size(8192);
    m->set_draft_vocab_size(64);
    m->set_num_hidden_layers(8);
    m->set_config_json(config_json_);
    for (int32_t id : {1, 3, 4, 5}) m->add_aux_layer_ids(id);
    resp->set_batches_per_epoch(1);
    resp->set_epochs(1);
    resp->mutable_data_fingerprint()->set_dataset("1111111111111111");
    resp->mutable_data_fingerprint()->set_samples("2222222222222222");
    resp->mutable_data_fingerprint()->set_draft_vocab("3333333333333333");
    resp->mutable_data_fingerprint()->set_aux_layers("1,3,4,5");
    if (!script_.older) {
      *resp->mutable_captured() = FeatureRequestToWire(EveryFeature({1, 3, 4, 5}));
      for (const std::string& g : script_.groups) resp->add_student_groups(g);
    }
    return grpc::Status::OK;
  }

  grpc::Status Subscribe(grpc::ServerContext* ctx, const v1::SubscribeRequest* req,
                         grpc::ServerWriter<v1::BatchDescriptor>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_request_ = *req;
    }
    ctx->AddInitialMetadata(kSubscriptionGenerationKey, "7");
    const int64_t T = 3;
    v1::BatchDescriptor d;
    d.set_version(v1::PROTOCOL_VERSION_CURRENT);
    d.set_batch_id(1);
    d.set_num_samples(1);
    d.set_num_tokens(T);
    d.add_sample_ids(0);
    d.set_transport(v1::TRANSPORT_INLINE);
    Add(&d, "input_ids", {T}, v1::DTYPE_I32, T * 4);
    Add(&d, "cu_seqlens", {2}, v1::DTYPE_I32, 8);
    Add(&d, "loss_mask", {T}, v1::DTYPE_U8, T);
    const int64_t width = script_.sent_layers * kPlanHidden;
    Add(&d, "aux_hidden", {T, width}, v1::DTYPE_F32, T * width * 4);
    Add(&d, "target_argmax", {T}, v1::DTYPE_I32, T * 4);
    std::string& cu = *d.mutable_tensors(1)->mutable_inline_data();
    const int32_t offsets[2] = {0, static_cast<int32_t>(T)};
    cu.assign(reinterpret_cast<const char*>(offsets), sizeof(offsets));
    writer->Write(d);
    return grpc::Status::OK;
  }

  v1::SubscribeRequest last_request() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_request_;
  }

 private:
  static void Add(v1::BatchDescriptor* d, const std::string& name, std::vector<int64_t> shape, v1::DType dtype,
                  int64_t bytes) {
    v1::TensorRef* t = d->add_tensors();
    t->set_name(name);
    for (int64_t s : shape) t->add_shape(s);
    t->set_dtype(dtype);
    t->set_inline_data(std::string(static_cast<size_t>(bytes), '\0'));
  }

  Script script_;
  std::string config_json_;
  mutable std::mutex mu_;  // the client may resubscribe while the test reads
  v1::SubscribeRequest last_request_;
};

struct PlanServed {
  std::unique_ptr<PlanTeacher> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  ~PlanServed() {
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
};

std::unique_ptr<PlanServed> ServePlan(Script script) {
  auto s = std::make_unique<PlanServed>();
  s->service = std::make_unique<PlanTeacher>(std::move(script));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(s->service.get());
  s->server = builder.BuildAndStart();
  s->address = absl::StrCat("127.0.0.1:", port);
  return s;
}

TeacherClientOptions PlanClient(const std::string& address, const std::string& group = "") {
  TeacherClientOptions o;
  o.address = address;
  o.subscriber_id = "rank-0";
  o.group = group;
  o.transports = {TransportKind::kInline};
  o.max_attempts = 2;
  o.initial_backoff = absl::Milliseconds(50);
  o.teacher_wait = absl::Seconds(2);
  return o;
}

FeatureRequest DFlashReads() {
  FeatureRequest r;
  r.aux_layer_ids = {5, 1};
  r.last_hidden = false;
  return r;
}

TEST(FeatureRequestClientTest, TheClientDescribesWhatItReceivesAndAsksForIt) {
  auto served = ServePlan({});
  auto client = TeacherClient::Connect(PlanClient(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->info().aux_layer_ids, (std::vector<int32_t>{1, 3, 4, 5}));
  ASSERT_TRUE((*client)->RequestFeatures(DFlashReads()).ok());
  EXPECT_EQ((*client)->info().captured_layer_ids, (std::vector<int32_t>{1, 3, 4, 5}));
  EXPECT_EQ((*client)->info().aux_layer_ids, (std::vector<int32_t>{5, 1}));
  EXPECT_EQ((*client)->info().fingerprint.aux_layers, "5,1");
  EXPECT_EQ((*client)->info().fingerprint.features, "aux_hidden,target_argmax");

  ASSERT_TRUE((*client)->Start(StreamCursor(0, 0, {}, 0)).ok());
  double wait = 0;
  auto batch = (*client)->Next(&wait);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->tensors.aux_hidden.sizes(), (std::vector<int64_t>{3, 2 * kPlanHidden}));
  EXPECT_FALSE(batch->tensors.last_hidden.defined());
  EXPECT_TRUE(batch->tensors.target_argmax.defined());
  // The Subscribe carried the request, and the fresh cursor the plan.
  const v1::SubscribeRequest req = served->service->last_request();
  ASSERT_TRUE(req.has_features());
  EXPECT_EQ(FeatureRequestFromWire(req.features()), DFlashReads());
  EXPECT_EQ((*client)->fingerprint().aux_layers, "5,1");
  // The plan is fixed once streaming.
  EXPECT_FALSE((*client)->RequestFeatures(EveryFeature({1})).ok());
}

TEST(FeatureRequestClientTest, ALayerTheTeacherDoesNotCaptureStopsTheStudentBeforeStreaming) {
  auto served = ServePlan({});
  auto client = TeacherClient::Connect(PlanClient(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  FeatureRequest other = DFlashReads();
  other.aux_layer_ids = {2, 5};
  const absl::Status st = (*client)->RequestFeatures(other);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find(absl::StrCat("teacher at ", served->address)), std::string::npos) << st;
  EXPECT_NE(st.message().find("does not capture [2]: it captures [1, 3, 4, 5]"), std::string::npos) << st;
}

TEST(FeatureRequestClientTest, ACheckpointOfAnotherPlanIsRefusedAtStart) {
  auto served = ServePlan({});
  auto client = TeacherClient::Connect(PlanClient(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->RequestFeatures(DFlashReads()).ok());
  DataFingerprint checkpoint = (*client)->info().fingerprint;
  checkpoint.aux_layers = "1,5";
  const absl::Status st = (*client)->Start(StreamCursor(0, 1, checkpoint, 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("aux layers the draft reads (--aux_layer_ids, --draft_algorithm): cursor 1,5, this "
                              "subscription 5,1"),
            std::string::npos)
      << st;
}

TEST(FeatureRequestClientTest, AGroupTheTeacherDoesNotServeStopsTheStudentAtConnect) {
  auto served = ServePlan(ServingGroups({"dflash"}));
  EXPECT_TRUE(TeacherClient::Connect(PlanClient(served->address, "dflash")).ok());
  auto lost = TeacherClient::Connect(PlanClient(served->address, "medusa"));
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(lost.status().message().find("serves no student group \"medusa\" (--student_group); it serves the "
                                         "default group and dflash: start it with --student_groups=medusa"),
            std::string::npos)
      << lost.status();
  auto bad = TeacherClient::Connect(PlanClient(served->address, "a b"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST(FeatureRequestClientTest, AnOlderTeacherServesOnlyADraftOfExactlyItsLayers) {
  auto served = ServePlan(Sending(4, /*older=*/true));
  auto client = TeacherClient::Connect(PlanClient(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Status st = (*client)->RequestFeatures(DFlashReads());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("takes no feature request (an older teacher_server): it sends aux layers [1, 3, 4, 5]"),
            std::string::npos)
      << st;
  FeatureRequest same = EveryFeature({1, 3, 4, 5});
  same.last_hidden = false;
  ASSERT_TRUE((*client)->RequestFeatures(same).ok());
  ASSERT_TRUE((*client)->Start(StreamCursor(0, 0, {}, 0)).ok());
  double wait = 0;
  auto batch = (*client)->Next(&wait);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->tensors.aux_hidden.size(1), 4 * kPlanHidden);
}

TEST(FeatureRequestClientTest, AuxStatesOfAnotherWidthAreRefused) {
  auto served = ServePlan(Sending(4, /*older=*/false));  // ignores the request: every captured layer
  auto client = TeacherClient::Connect(PlanClient(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->RequestFeatures(DFlashReads()).ok());
  ASSERT_TRUE((*client)->Start(StreamCursor(0, 0, {}, 0)).ok());
  double wait = 0;
  auto batch = (*client)->Next(&wait);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kDataLoss) << batch.status();
  EXPECT_NE(batch.status().message().find("aux_hidden of shape [3, 1024]; expected [T, 512] (aux layers [5, 1]"),
            std::string::npos)
      << batch.status();
}

}  // namespace
}  // namespace e3
