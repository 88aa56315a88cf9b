// The TeacherService over a real gRPC server on loopback, driven by a real
// client stub: GetInfo, GetWeights, Subscribe (inline and shm), Ack, the
// end of the stream, a cancelled stream, standard health checks and
// Generate, on a small real model (tests/fixtures/golden/rand_default_mha,
// vocab 256, hidden 64) and a synthetic dataset.
#include "teacher_server/service/teacher_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/data/vocab_map.h"
#include "common/metrics/metrics_server.h"
#include "common/model/model_dir.h"
#include "common/transport/shm_segment.h"
#include "proto/subscription_wire.h"
#include "proto/wire_codec.h"
#include "teacher_server/data/eval_set.h"
#include "teacher_server/runtime/generation.h"
#include "teacher_server/runtime/serialized_model.h"
#include "tests/metric_value.h"
#include "tests/teacher_server/loopback_teacher.h"
#include "tests/wait_for.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kDraftVocab = 100;

void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds ms = 10000ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + ms);
}

// The generation a Subscribe stream's acceptance announced (its initial
// metadata, there once the first message was read); 0 when absent.
uint64_t GenerationOf(grpc::ClientContext& stream) {
  const auto& md = stream.GetServerInitialMetadata();
  auto it = md.find(kSubscriptionGenerationKey);
  if (it == md.end()) return 0;
  return ParseSubscriptionGeneration(std::string(it->second.data(), it->second.size())).value_or(0);
}

// Acks `batch_ids` as rank 0 of `subscriber_id` on the subscription of
// `stream`, with a deadline; `committed`, when given, reports a
// checkpoint's cursor.
grpc::Status SendAck(v1::TeacherService::Stub& stub, const std::string& subscriber_id, grpc::ClientContext& stream,
                     const std::vector<int64_t>& batch_ids, v1::AckResponse* resp,
                     const v1::Cursor* committed = nullptr) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::AckRequest ack;
  ack.set_version(v1::PROTOCOL_VERSION_CURRENT);
  ack.set_subscriber_id(subscriber_id);
  ack.set_subscription_generation(GenerationOf(stream));
  ack.set_rank(0);
  for (int64_t id : batch_ids) ack.add_batch_ids(id);
  if (committed != nullptr) *ack.mutable_committed() = *committed;
  return stub.Ack(&ctx, ack, resp);
}

using testing::WaitFor;

// The value of an unlabelled sample in a text exposition; -1 if absent.
using testing::MetricValue;

bool ShmExists(const std::string& name) { return PathExists("/dev/shm" + name); }

int CountShm(const std::string& prefix) {
  int n = 0;
  auto names = ListDir("/dev/shm");
  EXPECT_TRUE(names.ok()) << names.status();
  if (!names.ok()) return -1;
  for (const auto& name : *names) {
    if (name.rfind(prefix.substr(1), 0) == 0) ++n;
  }
  return n;
}

class TeacherServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    grpc::EnableDefaultHealthCheckService(true);
    m_ = testing::LoadLoopbackModel(40, 3, kDraftVocab).release();
  }
  static void TearDownTestSuite() { delete m_; }

  EngineOptions DefaultEngineOptions() const {
    EngineOptions o;
    o.tokens_per_batch = 120;
    o.aux_layer_ids = {0, 2, 4};
    o.transports = {TransportKind::kShm, TransportKind::kInline};
    o.shm_prefix = shm_prefix_;
    return o;
  }

  std::unique_ptr<testing::LoopbackTeacher> StartTeacher(EngineOptions eopts, const Dataset* dataset = nullptr) {
    ServiceOptions sopts;
    sopts.hostname = "host-a";
    return testing::StartLoopbackTeacher(*m_, std::move(eopts), sopts, dataset);
  }

  static v1::SubscribeRequest SubscribeReq(const std::string& id, const std::string& host,
                                           std::vector<v1::Transport> accepted, int rank = 0, int world = 1,
                                           int credits = 4) {
    v1::SubscribeRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    req.set_subscriber_id(id);
    req.set_host(host);
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_credit_window(credits);
    for (auto t : accepted) req.add_accepted_transports(t);
    return req;
  }

  // Checks a resolved batch against the dataset and a direct forward.
  void CheckBatch(const ReceivedBatch& rb) {
    const v1::BatchDescriptor& d = rb.descriptor();
    ASSERT_GT(d.sample_ids_size(), 0);
    EXPECT_EQ(d.num_samples(), d.sample_ids_size());
    std::vector<int32_t> want_ids;
    std::vector<uint8_t> want_mask;
    std::vector<int32_t> want_cu{0};
    std::vector<std::vector<int32_t>> samples;
    for (int64_t s : d.sample_ids()) {
      ASSERT_GE(s, 0);
      ASSERT_LT(s, m_->dataset->size());
      const Sample& sample = (*m_->dataset)[s];
      want_ids.insert(want_ids.end(), sample.input_ids.begin(), sample.input_ids.end());
      want_mask.insert(want_mask.end(), sample.loss_mask.begin(), sample.loss_mask.end());
      want_cu.push_back(static_cast<int32_t>(want_ids.size()));
      samples.push_back(sample.input_ids);
    }
    const int64_t T = static_cast<int64_t>(want_ids.size());
    EXPECT_EQ(d.num_tokens(), T);

    auto ids = rb.Get("input_ids");
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(ids->dtype, DType::kI32);
    EXPECT_EQ(ids->shape, std::vector<int64_t>{T});
    ASSERT_EQ(ids->nbytes, want_ids.size() * 4);
    EXPECT_EQ(std::memcmp(ids->data, want_ids.data(), ids->nbytes), 0) << "input_ids differ from the samples";

    auto cu = rb.Get("cu_seqlens");
    ASSERT_TRUE(cu.ok()) << cu.status();
    EXPECT_EQ(cu->dtype, DType::kI32);
    EXPECT_EQ(cu->shape, std::vector<int64_t>{static_cast<int64_t>(want_cu.size())});
    ASSERT_EQ(cu->nbytes, want_cu.size() * 4);
    EXPECT_EQ(std::memcmp(cu->data, want_cu.data(), cu->nbytes), 0);

    auto mask = rb.Get("loss_mask");
    ASSERT_TRUE(mask.ok()) << mask.status();
    EXPECT_EQ(mask->dtype, DType::kU8);
    EXPECT_EQ(mask->shape, std::vector<int64_t>{T});
    ASSERT_EQ(mask->nbytes, want_mask.size());
    EXPECT_EQ(std::memcmp(mask->data, want_mask.data(), mask->nbytes), 0);

    auto aux = rb.Get("aux_hidden");
    ASSERT_TRUE(aux.ok()) << aux.status();
    EXPECT_EQ(aux->dtype, DType::kF32);
    EXPECT_EQ(aux->shape, (std::vector<int64_t>{T, 3 * 64}));
    auto last = rb.Get("last_hidden");
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ(last->dtype, DType::kF32);
    EXPECT_EQ(last->shape, (std::vector<int64_t>{T, 64}));
    auto argmax = rb.Get("target_argmax");
    ASSERT_TRUE(argmax.ok()) << argmax.status();
    EXPECT_EQ(argmax->dtype, DType::kI32);
    EXPECT_EQ(argmax->shape, std::vector<int64_t>{T});

    // The bytes are the forward's: recompute it here.
    auto batch = PackSamples(samples, 256, at::kCPU);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ForwardOptions fwd;
    fwd.aux_layer_ids = {0, 2, 4};
    fwd.return_argmax = true;
    auto out = m_->model->Forward(*batch, fwd);
    ASSERT_TRUE(out.ok()) << out.status();
    at::Tensor got_aux = torch::from_blob(const_cast<uint8_t*>(aux->data), {T, 192}, torch::kFloat).clone();
    at::Tensor got_last = torch::from_blob(const_cast<uint8_t*>(last->data), {T, 64}, torch::kFloat).clone();
    at::Tensor got_argmax = torch::from_blob(const_cast<uint8_t*>(argmax->data), {T}, torch::kInt).clone();
    EXPECT_TRUE(torch::allclose(got_aux, out->aux_hidden, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(got_last, out->last_hidden, 1e-5, 1e-5));
    EXPECT_TRUE(torch::equal(got_argmax, out->target_argmax.to(torch::kInt)));
  }

  static inline testing::LoopbackModel* m_ = nullptr;
  const std::string shm_prefix_ = absl::StrCat("/e3svctest", ::getpid());
};

TEST_F(TeacherServiceTest, GetInfoDescribesModelDataAndTransports) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetInfoRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::GetInfoResponse resp;
  grpc::Status st = t->stub->GetInfo(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.version(), v1::PROTOCOL_VERSION_CURRENT);
  const v1::ModelInfo& m = resp.model();
  EXPECT_EQ(m.hidden_size(), 64);
  EXPECT_EQ(m.num_hidden_layers(), 6);
  EXPECT_EQ(m.num_attention_heads(), 4);
  EXPECT_EQ(m.num_key_value_heads(), 4);
  EXPECT_EQ(m.head_dim(), 16);
  EXPECT_EQ(m.intermediate_size(), 128);
  EXPECT_EQ(m.vocab_size(), 256);
  EXPECT_EQ(m.draft_vocab_size(), kDraftVocab);
  EXPECT_EQ(m.max_position_embeddings(), 512);
  EXPECT_DOUBLE_EQ(m.rms_norm_eps(), 1e-5);
  EXPECT_EQ(std::vector<int32_t>(m.aux_layer_ids().begin(), m.aux_layer_ids().end()),
            (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(m.compute_dtype(), v1::DTYPE_F32);
  EXPECT_NE(m.config_json().find("\"vocab_size\": 256"), std::string::npos) << m.config_json();
  EXPECT_EQ(resp.dataset_samples(), 40);
  int64_t tokens = 0;
  for (const Sample& sample : m_->dataset->samples()) tokens += sample.size();
  EXPECT_EQ(resp.dataset_tokens(), tokens);
  ASSERT_EQ(resp.transports_size(), 2);
  EXPECT_EQ(resp.transports(0), v1::TRANSPORT_SHM);
  EXPECT_EQ(resp.transports(1), v1::TRANSPORT_INLINE);
  EXPECT_EQ(resp.backend(), "hf");
  EXPECT_EQ(resp.layout().tp_size(), 1);
  EXPECT_EQ(resp.layout().teacher_ranks(), 1);

  // A student of another protocol version is refused, naming both.
  grpc::ClientContext ctx2;
  SetDeadline(&ctx2);
  req.set_version(static_cast<v1::ProtocolVersion>(99));
  v1::GetInfoResponse resp2;
  st = t->stub->GetInfo(&ctx2, req, &resp2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("version 99"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find(absl::StrCat("version ", kProtocolVersion)), std::string::npos)
      << st.error_message();
}

struct Assembled {
  v1::TensorRef ref;  // without data
  std::string bytes;
  uint64_t received = 0;
  int chunks = 0;
};

TEST_F(TeacherServiceTest, GetWeightsStreamsTheFrozenTensors) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetWeightsRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  auto reader = t->stub->GetWeights(&ctx, req);
  std::map<std::string, Assembled> got;
  v1::WeightChunk chunk;
  while (reader->Read(&chunk)) {
    Assembled& a = got[chunk.tensor().name()];
    if (a.chunks == 0) {
      a.ref = chunk.tensor();
      a.ref.clear_inline_data();
      a.bytes.assign(chunk.total_bytes(), '\0');
    }
    ASSERT_EQ(chunk.total_bytes(), a.bytes.size());
    const std::string& data = chunk.tensor().inline_data();
    ASSERT_LE(chunk.offset() + data.size(), a.bytes.size()) << chunk.tensor().name();
    std::memcpy(&a.bytes[chunk.offset()], data.data(), data.size());
    a.received += data.size();
    ++a.chunks;
  }
  grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [name, a] : got) EXPECT_EQ(a.received, a.bytes.size()) << name;

  const Assembled& embed = got["embed_tokens"];
  EXPECT_EQ(embed.ref.dtype(), v1::DTYPE_F32);
  ASSERT_EQ(std::vector<int64_t>(embed.ref.shape().begin(), embed.ref.shape().end()),
            (std::vector<int64_t>{256, 64}));
  ASSERT_EQ(embed.bytes.size(), 256u * 64 * 4);
  at::Tensor e = torch::from_blob(const_cast<char*>(embed.bytes.data()), {256, 64}, torch::kFloat);
  EXPECT_TRUE(torch::equal(e, m_->model->embed_tokens().contiguous()));

  const Assembled& head = got["target_head"];
  EXPECT_EQ(head.ref.dtype(), v1::DTYPE_F32);
  ASSERT_EQ(std::vector<int64_t>(head.ref.shape().begin(), head.ref.shape().end()),
            (std::vector<int64_t>{kDraftVocab, 64}));
  ASSERT_EQ(head.bytes.size(), static_cast<size_t>(kDraftVocab) * 64 * 4);
  at::Tensor h = torch::from_blob(const_cast<char*>(head.bytes.data()), {kDraftVocab, 64}, torch::kFloat);
  at::Tensor lm = m_->model->lm_head();
  for (int64_t i = 0; i < kDraftVocab; ++i) {
    ASSERT_TRUE(torch::equal(h[i], lm[m_->vocab->DraftToTarget(i)])) << "draft row " << i;
  }
  // The rows are a real selection, not the head's first rows.
  EXPECT_NE(m_->vocab->TargetIds(), [] {
    std::vector<int64_t> first(kDraftVocab);
    for (int64_t i = 0; i < kDraftVocab; ++i) first[i] = i;
    return first;
  }());

  const Assembled& d2t = got["d2t"];
  EXPECT_EQ(d2t.ref.dtype(), v1::DTYPE_I64);
  ASSERT_EQ(std::vector<int64_t>(d2t.ref.shape().begin(), d2t.ref.shape().end()),
            std::vector<int64_t>{kDraftVocab});
  ASSERT_EQ(d2t.bytes.size(), static_cast<size_t>(kDraftVocab) * 8);
  std::vector<int64_t> d2t_got(kDraftVocab);
  std::memcpy(d2t_got.data(), d2t.bytes.data(), d2t.bytes.size());
  EXPECT_EQ(d2t_got, m_->vocab->d2t);

  const Assembled& t2d = got["t2d"];
  EXPECT_EQ(t2d.ref.dtype(), v1::DTYPE_BOOL);
  ASSERT_EQ(std::vector<int64_t>(t2d.ref.shape().begin(), t2d.ref.shape().end()), std::vector<int64_t>{256});
  ASSERT_EQ(t2d.bytes.size(), 256u);
  EXPECT_EQ(std::vector<uint8_t>(t2d.bytes.begin(), t2d.bytes.end()), m_->vocab->t2d);

  // Asking by name returns only that tensor.
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::GetWeightsRequest r;
    r.set_version(v1::PROTOCOL_VERSION_CURRENT);
    r.add_names("d2t");
    auto rd = t->stub->GetWeights(&c, r);
    std::set<std::string> names;
    while (rd->Read(&chunk)) names.insert(chunk.tensor().name());
    ASSERT_TRUE(rd->Finish().ok());
    EXPECT_EQ(names, std::set<std::string>{"d2t"});
  }
  // An unknown name is NOT_FOUND, naming it.
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::GetWeightsRequest r;
    r.set_version(v1::PROTOCOL_VERSION_CURRENT);
    r.add_names("embed_tokens");
    r.add_names("model.layers.0.mlp.up_proj.weight");
    auto rd = t->stub->GetWeights(&c, r);
    int n = 0;
    while (rd->Read(&chunk)) ++n;
    grpc::Status s = rd->Finish();
    EXPECT_EQ(n, 0);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(s.error_message().find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << s.error_message();
  }
}

TEST_F(TeacherServiceTest, OtherHostGetsInlineBatchesAndAcksReturnCredits) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 20000ms);
  auto reader = t->stub->Subscribe(&ctx, SubscribeReq("student-b", "host-b", {v1::TRANSPORT_SHM, v1::TRANSPORT_INLINE},
                                                       0, 1, /*credits=*/3));
  std::set<int64_t> seen_samples;
  int64_t expect_index = 0;
  for (int i = 0; i < 4; ++i) {
    v1::BatchDescriptor d;
    ASSERT_TRUE(reader->Read(&d)) << "stream ended early: " << reader->Finish().error_message();
    EXPECT_EQ(d.version(), v1::PROTOCOL_VERSION_CURRENT);
    EXPECT_FALSE(d.end_of_data());
    EXPECT_EQ(d.transport(), v1::TRANSPORT_INLINE);  // shm needs one host
    EXPECT_EQ(d.epoch(), 0);
    EXPECT_EQ(d.index_in_epoch(), expect_index++);
    ASSERT_EQ(d.tensors_size(), 6);
    for (const auto& ref : d.tensors()) {
      EXPECT_EQ(ref.location_case(), v1::TensorRef::kInlineData) << ref.name();
    }
    for (int64_t s : d.sample_ids()) EXPECT_TRUE(seen_samples.insert(s).second) << "sample " << s << " twice";
    const int64_t batch_id = d.batch_id();
    auto rb = ReceivedBatch::Resolve(std::move(d), t->engine->shm_segment_prefix());
    ASSERT_TRUE(rb.ok()) << rb.status();
    CheckBatch(**rb);

    v1::AckResponse aresp;
    grpc::Status st = SendAck(*t->stub, "student-b", ctx, {batch_id}, &aresp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    // Everything taken so far is acked: only computed-ahead batches use
    // credits, and at least the window minus one such batch is free.
    EXPECT_GE(aresp.credits(), 0);
    EXPECT_LE(aresp.credits(), 3);
  }
  // With nothing taken, the teacher computes ahead exactly to the window.
  ASSERT_TRUE(WaitFor([&] { return t->engine->stats().buffered_batches == 3; })) << t->engine->stats().buffered_batches;
  {
    v1::AckResponse aresp;
    ASSERT_TRUE(SendAck(*t->stub, "student-b", ctx, {}, &aresp).ok());
    EXPECT_EQ(aresp.credits(), 0);
  }
  // A stale subscriber's ack is refused.
  {
    v1::AckResponse aresp;
    grpc::Status st = SendAck(*t->stub, "someone-else", ctx, {}, &aresp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("student-b"), std::string::npos) << st.error_message();
  }
  // Taking one more leaves the window full; acking it frees one credit.
  {
    v1::BatchDescriptor d;
    ASSERT_TRUE(reader->Read(&d));
    EXPECT_EQ(d.index_in_epoch(), 4);
    v1::AckResponse aresp;
    ASSERT_TRUE(SendAck(*t->stub, "student-b", ctx, {d.batch_id()}, &aresp).ok());
    EXPECT_GE(aresp.credits(), 1);
    EXPECT_LE(aresp.credits(), 3);
  }
  // The sends were counted per transport.
  std::string text = RenderMetrics(*t->metrics.registry());
  EXPECT_NE(text.find("e3_teacher_bytes_sent_total{transport=\"inline\"}"), std::string::npos) << text;
  // The stream writes ahead of the reads, up to the credit window: with
  // all 5 read batches acked, at most 3 more can have been sent (a loaded
  // machine lets the writer reach the full window before this line).
  EXPECT_GE(MetricValue(text, "e3_teacher_batches_sent_total"), 5) << text;
  EXPECT_LE(MetricValue(text, "e3_teacher_batches_sent_total"), 5 + 3) << text;
  EXPECT_EQ(MetricValue(text, "e3_teacher_subscribers"), 1) << text;
  EXPECT_EQ(t->service->open_streams(), 1);
  ctx.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(TeacherServiceTest, SameHostGetsShmReferencesThatResolve) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 20000ms);
  auto reader =
      t->stub->Subscribe(&ctx, SubscribeReq("student-a", "host-a", {v1::TRANSPORT_SHM, v1::TRANSPORT_INLINE}));
  for (int i = 0; i < 2; ++i) {
    v1::BatchDescriptor d;
    ASSERT_TRUE(reader->Read(&d)) << reader->Finish().error_message();
    EXPECT_EQ(d.transport(), v1::TRANSPORT_SHM);
    ASSERT_EQ(d.tensors_size(), 6);
    std::string segment;
    for (const auto& ref : d.tensors()) {
      ASSERT_TRUE(ref.has_shm()) << ref.name();
      EXPECT_EQ(ref.shm().segment().rfind(shm_prefix_, 0), 0u) << ref.shm().segment();
      if (segment.empty()) segment = ref.shm().segment();
      EXPECT_EQ(ref.shm().segment(), segment);  // one segment per batch
    }
    const int64_t batch_id = d.batch_id();
    {
      auto rb = ReceivedBatch::Resolve(std::move(d), t->engine->shm_segment_prefix());
      ASSERT_TRUE(rb.ok()) << rb.status();
      CheckBatch(**rb);
    }
    // Acking frees the batch: its segment is unlinked.
    v1::AckResponse aresp;
    ASSERT_TRUE(SendAck(*t->stub, "student-a", ctx, {batch_id}, &aresp).ok());
    EXPECT_TRUE(WaitFor([&] { return !ShmExists(segment); })) << segment << " still exists after the ack";
  }
  std::string text = RenderMetrics(*t->metrics.registry());
  EXPECT_NE(text.find("e3_teacher_bytes_sent_total{transport=\"shm\"}"), std::string::npos) << text;
  ctx.TryCancel();
  reader->Finish();
}

TEST_F(TeacherServiceTest, NcclOnCpuHasNoCommonTransport) {
  EngineOptions o = DefaultEngineOptions();
  o.transports = {TransportKind::kNccl, TransportKind::kShm, TransportKind::kInline};
  auto t = StartTeacher(o);
  ASSERT_NE(t, nullptr);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto reader = t->stub->Subscribe(&ctx, SubscribeReq("gpu-student", "host-a", {v1::TRANSPORT_NCCL}));
  v1::BatchDescriptor d;
  EXPECT_FALSE(reader->Read(&d));
  grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("no common transport"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("nccl needs both on GPUs"), std::string::npos) << st.error_message();
  EXPECT_EQ(t->engine->world_size(), 0);  // nothing was subscribed
}

TEST_F(TeacherServiceTest, InconsistentSubscriptionsAreRefused) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  // Rank 0 of a world of 2 subscribes first and fixes the world.
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 20000ms);
  auto first = t->stub->Subscribe(&ctx, SubscribeReq("r0", "host-b", {v1::TRANSPORT_INLINE}, 0, 2));
  v1::BatchDescriptor d;
  ASSERT_TRUE(first->Read(&d)) << first->Finish().error_message();
  EXPECT_EQ(t->engine->world_size(), 2);

  auto refused = [&](const v1::SubscribeRequest& req) {
    grpc::ClientContext c;
    SetDeadline(&c);
    auto r = t->stub->Subscribe(&c, req);
    v1::BatchDescriptor x;
    EXPECT_FALSE(r->Read(&x));
    return r->Finish();
  };
  grpc::Status st = refused(SubscribeReq("r1", "host-b", {v1::TRANSPORT_INLINE}, 1, 4));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("world of 2"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("says 4"), std::string::npos) << st.error_message();

  st = refused(SubscribeReq("", "host-b", {v1::TRANSPORT_INLINE}, 1, 2));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("subscriber_id"), std::string::npos) << st.error_message();

  st = refused(SubscribeReq("r2", "host-b", {v1::TRANSPORT_INLINE}, 2, 2));  // rank outside the world
  EXPECT_FALSE(st.ok());

  v1::SubscribeRequest skew = SubscribeReq("r1", "host-b", {v1::TRANSPORT_INLINE}, 1, 2);
  skew.set_version(static_cast<v1::ProtocolVersion>(99));
  st = refused(skew);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("99"), std::string::npos) << st.error_message();

  // The first subscription is untouched by the refusals.
  EXPECT_TRUE(first->Read(&d));
  ctx.TryCancel();
  first->Finish();
}

TEST_F(TeacherServiceTest, StreamEndsWithEndOfDataThenOk) {
  std::unique_ptr<Dataset> tiny = testing::MakeSyntheticDataset(5, 11);
  EngineOptions o = DefaultEngineOptions();
  o.epochs = 1;
  o.tokens_per_batch = 40;  // a few batches from five samples
  auto t = StartTeacher(o, tiny.get());
  ASSERT_NE(t, nullptr);
  const int64_t per_epoch = t->engine->batches_per_epoch(1);
  ASSERT_GT(per_epoch, 1);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 20000ms);
  auto reader = t->stub->Subscribe(&ctx, SubscribeReq("tiny", "host-b", {v1::TRANSPORT_INLINE}, 0, 1, 2));
  std::multiset<int64_t> samples;
  int64_t batches = 0;
  bool ended = false;
  v1::BatchDescriptor d;
  while (reader->Read(&d)) {
    ASSERT_FALSE(ended) << "a descriptor after end_of_data";
    if (d.end_of_data()) {
      ended = true;
      EXPECT_EQ(d.tensors_size(), 0);
      continue;
    }
    ++batches;
    for (int64_t s : d.sample_ids()) samples.insert(s);
    v1::Cursor committed;
    committed.set_epoch(d.index_in_epoch() + 1 == per_epoch ? 1 : 0);
    committed.set_next_batch(d.index_in_epoch() + 1 == per_epoch ? 0 : d.index_in_epoch() + 1);
    v1::AckResponse aresp;
    ASSERT_TRUE(SendAck(*t->stub, "tiny", ctx, {d.batch_id()}, &aresp, &committed).ok());
  }
  grpc::Status st = reader->Finish();
  EXPECT_TRUE(ended);
  EXPECT_TRUE(st.ok()) << st.error_code() << ": " << st.error_message();
  EXPECT_EQ(batches, per_epoch);
  EXPECT_EQ(samples, (std::multiset<int64_t>{0, 1, 2, 3, 4}));
  LedgerReport rep = t->engine->ledger_report();
  EXPECT_EQ(rep.epochs, 1);
  EXPECT_EQ(rep.committed_samples, 5);
  EXPECT_EQ(rep.samples_never_committed, 0);
  EXPECT_TRUE(WaitFor([&] { return t->service->open_streams() == 0; }));
}

TEST_F(TeacherServiceTest, CancelledStreamIsDetachedAndReclaimed) {
  EngineOptions o = DefaultEngineOptions();
  o.subscriber_timeout = absl::Milliseconds(300);
  auto t = StartTeacher(o);
  ASSERT_NE(t, nullptr);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 20000ms);
  auto reader = t->stub->Subscribe(&ctx, SubscribeReq("quitter", "host-a", {v1::TRANSPORT_SHM}, 0, 1, 3));
  v1::BatchDescriptor d;
  ASSERT_TRUE(reader->Read(&d)) << reader->Finish().error_message();
  ASSERT_EQ(d.transport(), v1::TRANSPORT_SHM);
  ASSERT_TRUE(WaitFor([&] { return t->engine->stats().buffered_batches == 3; }));
  EXPECT_EQ(CountShm(shm_prefix_), 3);
  ctx.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server side sees the cancel, detaches, and after the timeout the
  // buffers (and their shm segments) go.
  EXPECT_TRUE(WaitFor([&] { return t->service->open_streams() == 0; }));
  EXPECT_TRUE(WaitFor([&] {
    EngineStats s = t->engine->stats();
    return s.buffered_batches == 0 && s.buffered_bytes == 0 && s.reclaimed_batches == 3;
  })) << t->engine->stats().buffered_batches << " buffered, " << t->engine->stats().reclaimed_batches << " reclaimed";
  EXPECT_TRUE(WaitFor([&] { return CountShm(shm_prefix_) == 0; }));
  t->metrics.Update(t->engine->stats());
  std::string text = RenderMetrics(*t->metrics.registry());
  EXPECT_EQ(MetricValue(text, "e3_teacher_subscribers"), 0) << text;
  EXPECT_EQ(MetricValue(text, "e3_teacher_reclaimed_batches_total"), 3) << text;
}

// Calls grpc.health.v1.Health/Check for the whole server ("") with raw
// bytes, returning the response bytes.
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel, std::string* out) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 5000ms);
  grpc::Slice empty(std::string{});
  grpc::ByteBuffer req(&empty, 1);  // an empty HealthCheckRequest is zero bytes
  grpc::ByteBuffer resp;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  auto fut = done.get_future();
  if (fut.wait_for(10s) != std::future_status::ready) {
    ctx.TryCancel();
    fut.wait();
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no health answer");
  }
  grpc::Status st = fut.get();
  out->clear();
  if (st.ok()) {
    std::vector<grpc::Slice> slices;
    if (!resp.Dump(&slices).ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "dump failed");
    for (const auto& s : slices) out->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return st;
}

TEST_F(TeacherServiceTest, StandardHealthServiceReportsServingState) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  ASSERT_NE(t->server->GetHealthCheckService(), nullptr);
  std::string bytes;
  grpc::Status st = HealthCheck(t->channel, &bytes);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
  t->server->GetHealthCheckService()->SetServingStatus(false);
  st = HealthCheck(t->channel, &bytes);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x02", 2));  // status: NOT_SERVING
}

TEST_F(TeacherServiceTest, GenerateIsGreedyArgmaxOfTheForward) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 7, 200};
  const int max_new = 6;
  // Expected: repeated argmax of the last position's full logits.
  std::vector<int32_t> ids = prompt, expected;
  const std::set<int64_t> eos(m_->model->config().eos_token_ids.begin(), m_->model->config().eos_token_ids.end());
  for (int step = 0; step < max_new; ++step) {
    auto batch = PackSamples({ids}, 256, at::kCPU);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ForwardOptions fwd;
    fwd.return_logits = true;
    fwd.return_argmax = false;
    auto out = m_->model->Forward(*batch, fwd);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->logits.size(0), static_cast<int64_t>(ids.size()));
    const int32_t next = static_cast<int32_t>(out->logits[-1].argmax().item<int64_t>());
    ids.push_back(next);
    expected.push_back(next);
    if (eos.count(next)) break;
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GenerateRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  for (int32_t id : prompt) req.add_input_ids(id);
  req.set_max_new_tokens(max_new);
  v1::GenerateResponse resp;
  grpc::Status st = t->stub->Generate(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(std::vector<int32_t>(resp.output_ids().begin(), resp.output_ids().end()), expected);
  if (!eos.count(expected.back())) {
    EXPECT_EQ(resp.output_ids_size(), max_new);
  }

  // Bad requests are refused, not crashed on.
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::GenerateRequest empty;
    empty.set_version(v1::PROTOCOL_VERSION_CURRENT);
    empty.set_max_new_tokens(3);
    v1::GenerateResponse r;
    EXPECT_EQ(t->stub->Generate(&c, empty, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::GenerateRequest too_long = req;
    too_long.set_max_new_tokens(510);  // 6 + 510 > 512 positions
    v1::GenerateResponse r;
    grpc::Status s = t->stub->Generate(&c, too_long, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("512"), std::string::npos) << s.error_message();
  }
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    v1::GenerateRequest bad_id = req;
    bad_id.add_input_ids(256);  // outside the vocab
    v1::GenerateResponse r;
    grpc::Status s = t->stub->Generate(&c, bad_id, &r);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(r.output_ids_size(), 0);
  }
}

// The eval set: progress while the teacher generates (sharing the model
// with the engine's batches through SerializedCausalLM), then each prompt
// with its greedy continuation, the continuation marked in loss_mask, and
// the aux states of the whole sample; without one, a clear refusal.
TEST_F(TeacherServiceTest, GetEvalSetServesGenerateContinuationsWithTheirAuxStates) {
  auto t = StartTeacher(DefaultEngineOptions());
  ASSERT_NE(t, nullptr);
  auto get = [&](std::vector<v1::EvalSetChunk>* chunks) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::GetEvalSetRequest req;
    req.set_version(v1::PROTOCOL_VERSION_CURRENT);
    auto reader = t->stub->GetEvalSet(&ctx, req);
    v1::EvalSetChunk chunk;
    while (reader->Read(&chunk)) chunks->push_back(chunk);
    return reader->Finish();
  };
  std::vector<v1::EvalSetChunk> none;
  grpc::Status st = get(&none);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("--eval_prompts"), std::string::npos) << st.error_message();

  SerializedCausalLM serialized(m_->model.get());
  const std::vector<std::vector<int32_t>> prompts = {{3, 17, 42}, {7, 8, 9, 10, 11, 12}, {100}, {55, 66}};
  EvalSetOptions eo;
  eo.max_new_tokens = 6;
  eo.aux_layer_ids = {0, 2, 4};
  eo.tokens_per_batch = 16;  // several batches
  eo.generate_batch = 3;
  auto eval = EvalSet::Start(&serialized, prompts, eo);
  t->service->SetEvalSet(eval.get());
  std::vector<v1::EvalSetChunk> chunks;
  for (int i = 0; i < 500; ++i) {
    chunks.clear();
    st = get(&chunks);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_FALSE(chunks.empty());
    EXPECT_EQ(chunks[0].prompts(), 4);
    if (chunks[0].ready()) break;
    EXPECT_EQ(chunks.size(), 1u);  // progress only
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(chunks[0].ready());
  GenerationOptions g;
  g.max_new_tokens = 6;
  auto want = GenerateContinuations(*m_->model, prompts, g);
  ASSERT_TRUE(want.ok()) << want.status();
  size_t next_prompt = 0;
  for (const auto& chunk : chunks) {
    EXPECT_EQ(chunk.batch_count(), static_cast<int>(chunks.size()));
    auto rb = ReceivedBatch::Resolve(chunk.batch(), t->engine->shm_segment_prefix());
    ASSERT_TRUE(rb.ok()) << rb.status();
    auto ids = (*rb)->Get("input_ids"), cu = (*rb)->Get("cu_seqlens"), mask = (*rb)->Get("loss_mask"),
         aux = (*rb)->Get("aux_hidden");
    ASSERT_TRUE(ids.ok() && cu.ok() && mask.ok() && aux.ok());
    const auto* id = reinterpret_cast<const int32_t*>(ids->data);
    const auto* off = reinterpret_cast<const int32_t*>(cu->data);
    std::vector<std::vector<int32_t>> samples;
    for (int64_t s = 0; s + 1 < cu->shape[0]; ++s, ++next_prompt) {
      ASSERT_LT(next_prompt, prompts.size());
      std::vector<int32_t> expect = prompts[next_prompt];
      expect.insert(expect.end(), (*want)[next_prompt].begin(), (*want)[next_prompt].end());
      EXPECT_EQ(std::vector<int32_t>(id + off[s], id + off[s + 1]), expect) << "prompt " << next_prompt;
      for (int32_t k = off[s]; k < off[s + 1]; ++k) {
        EXPECT_EQ(mask->data[k], k - off[s] >= static_cast<int32_t>(prompts[next_prompt].size()) ? 1 : 0);
      }
      samples.push_back(expect);
    }
    auto batch = PackSamples(samples, 256, at::kCPU);
    ForwardOptions fwd;
    fwd.aux_layer_ids = {0, 2, 4};
    auto out = m_->model->Forward(*batch, fwd);
    ASSERT_TRUE(out.ok());
    at::Tensor got = torch::from_blob(const_cast<uint8_t*>(aux->data), {ids->shape[0], 192}, torch::kFloat);
    EXPECT_TRUE(torch::allclose(got, out->aux_hidden, 1e-5, 1e-5));
  }
  EXPECT_EQ(next_prompt, prompts.size());
  EXPECT_GT(chunks.size(), 1u);
  t->service->SetEvalSet(nullptr);
}

// The student's side of the wire: a corrupt descriptor is an error that
// names the tensor, never a pointer past the bytes it holds.
TEST(WireCodecTest, ResolveRefusesCorruptDescriptors) {
  auto resolve = [](std::function<void(v1::TensorRef*)> edit) {
    v1::BatchDescriptor d;
    d.set_batch_id(7);
    v1::TensorRef* ref = d.add_tensors();
    ref->set_name("input_ids");
    ref->set_dtype(v1::DTYPE_I32);
    ref->add_shape(4);
    ref->set_inline_data(std::string(16, '\1'));
    edit(ref);
    return ReceivedBatch::Resolve(std::move(d), "/e3-1-");
  };
  auto good = resolve([](v1::TensorRef*) {});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->Get("input_ids")->nbytes, 16u);
  EXPECT_FALSE((*good)->Get("loss_mask").ok());

  auto short_bytes = resolve([](v1::TensorRef* r) { r->set_inline_data(std::string(15, '\0')); });
  EXPECT_EQ(short_bytes.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(short_bytes.status().message().find("input_ids"), std::string::npos) << short_bytes.status();

  auto negative = resolve([](v1::TensorRef* r) { r->set_shape(0, -4); });
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kDataLoss);

  auto bad_dtype = resolve([](v1::TensorRef* r) { r->set_dtype(static_cast<v1::DType>(42)); });
  EXPECT_EQ(bad_dtype.status().code(), absl::StatusCode::kDataLoss);

  // 2^32 x 2^32 elements wrap a 64-bit count to 0: must not pass as an
  // empty tensor.
  auto wraps = resolve([](v1::TensorRef* r) {
    r->set_dtype(v1::DTYPE_U8);
    r->set_shape(0, int64_t{1} << 32);
    r->add_shape(int64_t{1} << 32);
    r->set_inline_data("");
  });
  EXPECT_EQ(wraps.status().code(), absl::StatusCode::kDataLoss) << wraps.status();
  auto wraps_bytes = resolve([](v1::TensorRef* r) {
    r->set_dtype(v1::DTYPE_I64);
    r->set_shape(0, int64_t{1} << 61);  // x 8 bytes wraps to 0
    r->set_inline_data("");
  });
  EXPECT_EQ(wraps_bytes.status().code(), absl::StatusCode::kDataLoss) << wraps_bytes.status();
  // A zero dimension is an honest empty tensor, whatever the others say.
  auto empty = resolve([](v1::TensorRef* r) {
    r->set_shape(0, int64_t{1} << 62);
    r->add_shape(0);
    r->set_inline_data("");
  });
  EXPECT_TRUE(empty.ok()) << empty.status();

  // shm segments only with the teacher's prefix: a descriptor cannot make
  // the student map another process's segment.
  for (const char* segment : {"/postgres-shm-1", "/e3-2-7", "/e3-1-x/../../etc"}) {
    auto foreign = resolve([&](v1::TensorRef* r) {
      r->clear_inline_data();
      r->mutable_shm()->set_segment(segment);
      r->mutable_shm()->set_nbytes(16);
    });
    EXPECT_EQ(foreign.status().code(), absl::StatusCode::kDataLoss) << segment;
    EXPECT_NE(foreign.status().message().find("is not one of this teacher's"), std::string::npos)
        << foreign.status();
  }

  // shm: a missing segment, and a range outside a real one.
  auto missing = resolve([](v1::TensorRef* r) {
    r->mutable_shm()->set_segment("/e3-1-no-such-segment-for-this-test");
    r->mutable_shm()->set_nbytes(16);
  });
  EXPECT_FALSE(missing.ok());
  const std::string name = absl::StrCat("/e3-1-codectest", ::getpid());  // the prefix resolve() accepts
  auto seg = ShmSegment::Create(name, 32);
  ASSERT_TRUE(seg.ok()) << seg.status();
  (*seg)->set_unlink_on_destroy(true);
  auto outside = resolve([&](v1::TensorRef* r) {
    r->mutable_shm()->set_segment(name);
    r->mutable_shm()->set_offset(24);
    r->mutable_shm()->set_nbytes(16);
  });
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(outside.status().message().find("outside"), std::string::npos) << outside.status();
  auto inside = resolve([&](v1::TensorRef* r) {
    r->mutable_shm()->set_segment(name);
    r->mutable_shm()->set_offset(16);
    r->mutable_shm()->set_nbytes(16);
  });
  EXPECT_TRUE(inside.ok()) << inside.status();
}

// Device transports move a batch as one block; each tensor is a range of
// it. Resolve checks every range against the block and the shape, refuses
// batches that mix device and host refs, and DescribePayload writes what
// Resolve reads (round trip over a device payload's layout).
TEST(WireCodecTest, DeviceRefsAreCheckedRangesOfOnePayloadBlock) {
  auto descriptor = [](v1::Transport transport) {
    v1::BatchDescriptor d;
    d.set_batch_id(9);
    d.set_transport(transport);
    d.set_payload_bytes(128);
    for (auto [name, offset, n] : {std::tuple<const char*, int, int>{"input_ids", 0, 4}, {"aux_hidden", 64, 16}}) {
      v1::TensorRef* ref = d.add_tensors();
      ref->set_name(name);
      ref->set_dtype(v1::DTYPE_I32);
      ref->add_shape(n);
      if (transport == v1::TRANSPORT_NCCL) {
        ref->mutable_nccl()->set_offset(offset);
        ref->mutable_nccl()->set_nbytes(4 * n);
      } else {
        ref->mutable_cuda_ipc()->set_handle(std::string(64, 'h'));
        ref->mutable_cuda_ipc()->set_device(3);
        ref->mutable_cuda_ipc()->set_offset(offset);
        ref->mutable_cuda_ipc()->set_nbytes(4 * n);
      }
    }
    return d;
  };
  auto nccl = ReceivedBatch::Resolve(descriptor(v1::TRANSPORT_NCCL), "");
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_TRUE((*nccl)->on_device());
  EXPECT_EQ((*nccl)->payload_bytes(), 128u);
  EXPECT_EQ((*nccl)->Get("aux_hidden")->offset, 64u);
  EXPECT_EQ((*nccl)->Get("aux_hidden")->data, nullptr);
  auto ipc = ReceivedBatch::Resolve(descriptor(v1::TRANSPORT_CUDA_IPC), "");
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  EXPECT_EQ((*ipc)->ipc_handle(), std::string(64, 'h'));
  EXPECT_EQ((*ipc)->ipc_device(), 3);

  auto outside = descriptor(v1::TRANSPORT_NCCL);
  outside.mutable_tensors(1)->mutable_nccl()->set_offset(100);
  auto r = ReceivedBatch::Resolve(outside, "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("aux_hidden"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("outside the payload of 128 bytes"), std::string::npos) << r.status();

  auto wrong_size = descriptor(v1::TRANSPORT_CUDA_IPC);
  wrong_size.mutable_tensors(0)->mutable_cuda_ipc()->set_nbytes(12);
  r = ReceivedBatch::Resolve(wrong_size, "");
  EXPECT_NE(r.status().message().find("shape needs 16"), std::string::npos) << r.status();

  auto two_handles = descriptor(v1::TRANSPORT_CUDA_IPC);
  two_handles.mutable_tensors(1)->mutable_cuda_ipc()->set_handle(std::string(64, 'x'));
  r = ReceivedBatch::Resolve(two_handles, "");
  EXPECT_NE(r.status().message().find("handle differs"), std::string::npos) << r.status();

  auto mixed = descriptor(v1::TRANSPORT_NCCL);
  mixed.mutable_tensors(1)->set_inline_data(std::string(64, '\0'));
  r = ReceivedBatch::Resolve(mixed, "");
  EXPECT_NE(r.status().message().find("mixes device and host"), std::string::npos) << r.status();

  auto nowhere = descriptor(v1::TRANSPORT_NCCL);
  nowhere.mutable_tensors(0)->clear_location();
  r = ReceivedBatch::Resolve(nowhere, "");
  EXPECT_NE(r.status().message().find("no location"), std::string::npos) << r.status();
}

// GPU memory as DescribePayload sees it: only its identity matters here
// (the bytes never leave the GPU), so a host buffer stands in for it.
class HostBackedDeviceMemory : public DeviceMemory {
 public:
  explicit HostBackedDeviceMemory(size_t n) : bytes_(n), handle_(64, 'k') {}
  uint8_t* data() const override { return const_cast<uint8_t*>(bytes_.data()); }
  size_t capacity() const override { return bytes_.size(); }
  int device() const override { return 1; }
  const std::string& ipc_handle() const override { return handle_; }

 private:
  std::vector<uint8_t> bytes_;
  std::string handle_;
};

TEST(WireCodecTest, DescribedDevicePayloadsResolveToTheirLayout) {
  std::vector<int32_t> ids(5), argmax(5);
  std::vector<uint16_t> hidden(5 * 8);
  auto layout = PayloadBuffer::LayOut({{"input_ids", DType::kI32, {5}, ids.data(), 20},
                                       {"last_hidden", DType::kBF16, {5, 8}, hidden.data(), 80},
                                       {"target_argmax", DType::kI32, {5}, argmax.data(), 20}});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->total_bytes, 64u + 128u + 64u);
  for (TransportKind kind : {TransportKind::kNccl, TransportKind::kCudaIpc}) {
    auto payload = PayloadBuffer::OnDevice(kind, *layout, std::make_shared<HostBackedDeviceMemory>(256));
    EXPECT_EQ(payload->data(), nullptr);
    v1::BatchDescriptor d;
    DescribePayload(*payload, &d);
    EXPECT_EQ(d.payload_bytes(), 256u);
    EXPECT_EQ(d.transport(), ToWire(kind));
    auto rb = ReceivedBatch::Resolve(d, "");
    ASSERT_TRUE(rb.ok()) << rb.status();
    EXPECT_EQ((*rb)->Get("last_hidden")->offset, 64u);
    EXPECT_EQ((*rb)->Get("target_argmax")->offset, 192u);
    EXPECT_EQ((*rb)->Get("last_hidden")->shape, (std::vector<int64_t>{5, 8}));
    if (kind == TransportKind::kCudaIpc) {
      EXPECT_EQ((*rb)->ipc_handle(), std::string(64, 'k'));
      EXPECT_EQ((*rb)->ipc_device(), 1);
    }
  }
  // Host transports refuse to build device payloads and vice versa.
  EXPECT_EQ(PayloadBuffer::Build(TransportKind::kNccl, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace e3
