// What a lying or broken teacher can make a student hold: the real
// TeacherClient against a hostile TeacherService on loopback (a fake peer:
// the thing under test is the client). The teacher's GetInfo describes
// tiny-code-llama (vocab 8192, hidden 256) with a draft vocab of 64; the
// weights it then streams must have exactly the sizes those dims give,
// within --max_weights_bytes, and no message may pass
// --max_receive_message_bytes. Each refusal is prompt and names the
// tensor, the field or the cap.
#include "student_trainer/feed/teacher_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "proto/wire_codec.h"

namespace e3 {
namespace {

constexpr int64_t kVocab = 8192, kHidden = 256, kDraft = 64;

enum class Lie {
  kNone,
  kOversizeShape,   // embed_tokens claims 1000x the rows
  kHugeTotalBytes,  // right shape, total_bytes of 2^62
  kDimsDisagree,    // GetInfo's hidden_size differs from its config.json
  kHugeBatch,       // one batch message of 2 MiB
};

class HostileTeacher final : public v1::TeacherService::Service {
 public:
  explicit HostileTeacher(Lie lie) : lie_(lie) {
    config_json_ =
        ReadFileToString(std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama/config.json")
            .value();
  }

  grpc::Status GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*,
                       v1::GetInfoResponse* resp) override {
    resp->set_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::ModelInfo* m = resp->mutable_model();
    m->set_hidden_size(lie_ == Lie::kDimsDisagree ? kHidden * 1000 : kHidden);
    m->set_vocab_size(kVocab);
    m->set_draft_vocab_size(kDraft);
    m->set_num_hidden_layers(8);
    m->set_config_json(config_json_);
    resp->set_batches_per_epoch(1);
    resp->set_epochs(1);
    return grpc::Status::OK;
  }

  grpc::Status GetWeights(grpc::ServerContext*, const v1::GetWeightsRequest*,
                          grpc::ServerWriter<v1::WeightChunk>* writer) override {
    const int64_t rows = lie_ == Lie::kOversizeShape ? kVocab * 1000 : kVocab;
    Send(writer, "embed_tokens", {rows, kHidden}, v1::DTYPE_F32,
         std::string(kVocab * kHidden * 4, '\0'),
         lie_ == Lie::kHugeTotalBytes ? uint64_t{1} << 62 : 0);
    Send(writer, "target_head", {kDraft, kHidden}, v1::DTYPE_F32,
         std::string(kDraft * kHidden * 4, '\0'), 0);
    Send(writer, "d2t", {kDraft}, v1::DTYPE_I64, std::string(kDraft * 8, '\0'), 0);
    std::string t2d(kVocab, '\0');
    for (int i = 0; i < kDraft; ++i) t2d[i] = 1;
    Send(writer, "t2d", {kVocab}, v1::DTYPE_BOOL, t2d, 0);
    return grpc::Status::OK;
  }

  grpc::Status Subscribe(grpc::ServerContext*, const v1::SubscribeRequest*,
                         grpc::ServerWriter<v1::BatchDescriptor>* writer) override {
    ++subscribes_;
    v1::BatchDescriptor d;
    d.set_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::TensorRef* t = d.add_tensors();
    t->set_name("input_ids");
    t->add_shape(512 << 10);
    t->set_dtype(v1::DTYPE_I32);
    t->set_inline_data(std::string(2 << 20, '\0'));
    writer->Write(d);
    return grpc::Status::OK;
  }

  int subscribes() const { return subscribes_; }

 private:
  // Streams `bytes` in 1 MiB chunks, each saying `total` (0: the truth).
  static void Send(grpc::ServerWriter<v1::WeightChunk>* writer, const std::string& name,
                   std::vector<int64_t> shape, v1::DType dtype, const std::string& bytes,
                   uint64_t total) {
    size_t offset = 0;
    do {
      const size_t n = std::min<size_t>(1 << 20, bytes.size() - offset);
      v1::WeightChunk c;
      c.mutable_tensor()->set_name(name);
      for (int64_t d : shape) c.mutable_tensor()->add_shape(d);
      c.mutable_tensor()->set_dtype(dtype);
      c.mutable_tensor()->set_inline_data(bytes.substr(offset, n));
      c.set_offset(offset);
      c.set_total_bytes(total != 0 ? total : bytes.size());
      if (!writer->Write(c)) return;
      offset += n;
    } while (offset < bytes.size());
  }

  Lie lie_;
  std::string config_json_;
  std::atomic<int> subscribes_{0};
};

struct Served {
  std::unique_ptr<HostileTeacher> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  ~Served() {
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
};

std::unique_ptr<Served> Serve(Lie lie) {
  auto s = std::make_unique<Served>();
  s->service = std::make_unique<HostileTeacher>(lie);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(s->service.get());
  builder.SetMaxSendMessageSize(64 << 20);
  s->server = builder.BuildAndStart();
  s->address = absl::StrCat("127.0.0.1:", port);
  return s;
}

TeacherClientOptions ClientOptions(const std::string& address) {
  TeacherClientOptions o;
  o.address = address;
  o.subscriber_id = "rank-0";
  o.transports = {TransportKind::kInline};
  o.max_attempts = 3;
  o.initial_backoff = absl::Milliseconds(50);
  o.rpc_timeout = absl::Seconds(20);
  return o;
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& message) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(message), std::string::npos) << s;
}

TEST(TeacherClientLimitsTest, HonestWeightsOfTheDescribedSizesArrive) {
  auto served = Serve(Lie::kNone);
  auto client = TeacherClient::Connect(ClientOptions(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  auto w = (*client)->FetchWeights();
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->embed_tokens.sizes(), (std::vector<int64_t>{kVocab, kHidden}));
  EXPECT_EQ(w->target_head.sizes(), (std::vector<int64_t>{kDraft, kHidden}));
  EXPECT_EQ(w->vocab.draft_vocab_size(), kDraft);
}

TEST(TeacherClientLimitsTest, AWeightLargerThanTheModelDimsIsRefused) {
  auto served = Serve(Lie::kOversizeShape);
  auto client = TeacherClient::Connect(ClientOptions(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  auto w = (*client)->FetchWeights();
  ExpectError(w.status(), absl::StatusCode::kDataLoss,
              "WeightChunk for \"embed_tokens\": tensor.shape is [8192000, 256]; the model's dims "
              "need [8192, 256]");
}

TEST(TeacherClientLimitsTest, ALyingTotalSizeIsRefusedBeforeAllocating) {
  auto served = Serve(Lie::kHugeTotalBytes);
  auto client = TeacherClient::Connect(ClientOptions(served->address));
  ASSERT_TRUE(client.ok()) << client.status();
  auto w = (*client)->FetchWeights();
  ExpectError(w.status(), absl::StatusCode::kDataLoss,
              "total_bytes is 4611686018427387904; shape and dtype need 8388608");
}

TEST(TeacherClientLimitsTest, TheWholeDownloadIsCapped) {
  auto served = Serve(Lie::kNone);
  TeacherClientOptions o = ClientOptions(served->address);
  o.max_weights_bytes = 4 << 20;  // embed_tokens alone is 8 MiB
  auto client = TeacherClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto w = (*client)->FetchWeights();
  ExpectError(w.status(), absl::StatusCode::kResourceExhausted,
              "weight \"embed_tokens\" needs 8388608 bytes, which with the 0 already received "
              "exceeds the cap of "
              "4194304 (--max_weights_bytes)");
}

TEST(TeacherClientLimitsTest, DimsThatDisagreeWithTheConfigAreRefusedAtConnect) {
  auto served = Serve(Lie::kDimsDisagree);
  auto client = TeacherClient::Connect(ClientOptions(served->address));
  ASSERT_FALSE(client.ok());
  ExpectError(client.status(), absl::StatusCode::kDataLoss,
              "GetInfoResponse.model says hidden_size 256000, vocab_size 8192 but its config_json "
              "says 256, 8192");
}

TEST(TeacherClientLimitsTest, AMessageOverTheReceiveCapEndsTheStreamAtOnce) {
  auto served = Serve(Lie::kHugeBatch);
  TeacherClientOptions o = ClientOptions(served->address);
  o.max_receive_message_bytes = 1 << 20;
  auto client = TeacherClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Start({0, 0}).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto batch = (*client)->Next(nullptr);
  ASSERT_FALSE(batch.ok());
  ExpectError(batch.status(), absl::StatusCode::kResourceExhausted,
              "--max_receive_message_bytes is 1048576");
  // The same message would be too large again: no retries.
  EXPECT_EQ(served->service->subscribes(), 1);
  EXPECT_EQ((*client)->reconnects(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(TeacherClientLimitsTest, CapsOutsideGrpcsRangeAreRefused) {
  TeacherClientOptions o = ClientOptions("127.0.0.1:1");
  o.max_receive_message_bytes = int64_t{1} << 40;
  auto client = TeacherClient::Connect(o);
  ASSERT_FALSE(client.ok());
  ExpectError(client.status(), absl::StatusCode::kInvalidArgument,
              "--max_receive_message_bytes is 1099511627776");
}

}  // namespace
}  // namespace e3
