#include "teacher_server/service/teacher_service.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/gpu/cuda_runtime.h"
#include "common/rpc/peer_address.h"
#include "common/torch/tensor_convert.h"
#include "proto/subscription_wire.h"
#include "proto/wire_codec.h"
#include "teacher_server/runtime/generation.h"

namespace e3 {
namespace {

// Inline weight chunks stay well under gRPC's default 4 MiB message cap
// (and under half of a smaller send cap).
constexpr size_t kWeightChunkBytes = 1 << 20;

// A message over the send cap would fail in gRPC as a broken stream, which
// a student retries; this says which message and which flag instead.
// FailedPrecondition: the same batch would be too large again.
grpc::Status CheckOutgoing(const google::protobuf::Message& msg, int64_t max_send_bytes, const std::string& what) {
  const size_t bytes = msg.ByteSizeLong();
  if (bytes <= static_cast<size_t>(max_send_bytes)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      absl::StrCat(what, " is ", bytes, " bytes, over the teacher's --max_send_message_bytes=",
                                   max_send_bytes, "; raise it (and the student's --max_receive_message_bytes), "
                                   "lower --tokens_per_batch, or use shm"));
}

template <typename T>
class ErrorWriteReactor : public grpc::ServerWriteReactor<T> {
 public:
  explicit ErrorWriteReactor(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

WeightBlob BlobOf(const std::string& name, const at::Tensor& t) {
  auto w = TensorToWritable(name, t);
  return {name, w->dtype, w->shape, std::move(w->data)};
}

// Streams the batches the engine makes for one subscription. All state is
// guarded by `link->mu`, which the engine's notifier also takes, so the
// notifier never touches a reactor that OnDone has deleted.
class SubscribeReactor : public grpc::ServerWriteReactor<v1::BatchDescriptor> {
 public:
  struct Link {
    std::recursive_mutex mu;
    SubscribeReactor* reactor = nullptr;
  };

  // `nccl` is set when the subscription negotiated the NCCL transport.
  SubscribeReactor(grpc::CallbackServerContext* ctx, Engine* engine, TeacherMetrics* metrics,
                   std::atomic<int>* open_streams, int rank, uint64_t generation, std::unique_ptr<NcclSender> nccl,
                   int64_t max_send_bytes)
      : engine_(engine), metrics_(metrics), open_streams_(open_streams), rank_(rank), generation_(generation),
        link_(std::make_shared<Link>()), nccl_(std::move(nccl)), max_send_bytes_(max_send_bytes) {
    // The acceptance, before any batch: the student learns the generation
    // its Acks and commits must carry even while no batch is ready.
    ctx->AddInitialMetadata(kSubscriptionGenerationKey, std::to_string(generation));
    StartSendInitialMetadata();
    link_->reactor = this;
    ++*open_streams_;
    metrics_->SetSubscribers(*open_streams_);
    std::shared_ptr<Link> link = link_;
    engine_->SetNotifier(rank_, generation_, [link] {
      std::lock_guard<std::recursive_mutex> lock(link->mu);
      if (link->reactor != nullptr) link->reactor->MaybeWriteLocked();
    });
    std::lock_guard<std::recursive_mutex> lock(link_->mu);
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(link_->mu);
    writing_ = false;
    if (ok && current_payload_ != nullptr) {
      metrics_->AddBytesSent(current_payload_->transport(), static_cast<double>(current_payload_->total_bytes()));
      metrics_->BatchSent();
    }
    current_payload_.reset();
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken"));
      return;
    }
    if (last_written_) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    MaybeWriteLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::recursive_mutex> lock(link_->mu);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    {
      std::lock_guard<std::recursive_mutex> lock(link_->mu);
      link_->reactor = nullptr;
    }
    engine_->Detach(rank_, generation_);
    nccl_.reset();  // cancels a send the student will not receive
    --*open_streams_;
    metrics_->SetSubscribers(*open_streams_);
    delete this;
  }

  void MaybeWriteLocked() {
    if (writing_ || finished_) return;
    if (nccl_ != nullptr) {
      absl::Status sent = nccl_->status();
      if (!sent.ok()) {
        FinishLocked(ToGrpcStatus(sent));
        return;
      }
    }
    auto next = engine_->TakeNext(rank_, generation_);
    if (!next.ok()) {
      FinishLocked(ToGrpcStatus(next.status()));
      return;
    }
    if (!next->has_value()) return;
    const ReadyBatch& b = **next;
    msg_.Clear();
    msg_.set_version(v1::PROTOCOL_VERSION_CURRENT);
    msg_.set_batch_id(b.batch_id);
    msg_.set_epoch(b.epoch);
    msg_.set_index_in_epoch(b.index);
    msg_.set_end_of_data(b.end_of_data);
    msg_.set_num_samples(static_cast<int32_t>(b.sample_ids.size()));
    msg_.set_num_tokens(b.num_tokens);
    for (int64_t s : b.sample_ids) msg_.add_sample_ids(s);
    if (b.payload) DescribePayload(*b.payload, &msg_);
    grpc::Status size = CheckOutgoing(msg_, max_send_bytes_, absl::StrCat("batch ", b.batch_id));
    if (!size.ok()) {
      FinishLocked(size);
      return;
    }
    if (b.payload && b.payload->transport() == TransportKind::kNccl) {
      if (nccl_ == nullptr) {
        FinishLocked(grpc::Status(grpc::StatusCode::INTERNAL, "NCCL payload on a stream without an NCCL channel"));
        return;
      }
      // Queued before the descriptor goes out; the student receives in
      // descriptor order, which is this order.
      nccl_->Enqueue(b.payload);
    }
    current_payload_ = b.payload;  // keeps shm alive until written
    last_written_ = b.end_of_data;
    writing_ = true;
    StartWrite(&msg_);
  }

 private:
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  Engine* engine_;
  TeacherMetrics* metrics_;
  std::atomic<int>* open_streams_;
  int rank_;
  uint64_t generation_;
  std::shared_ptr<Link> link_;
  v1::BatchDescriptor msg_;
  std::shared_ptr<const PayloadBuffer> current_payload_;
  std::unique_ptr<NcclSender> nccl_;
  int64_t max_send_bytes_;
  bool writing_ = false;
  bool finished_ = false;
  bool last_written_ = false;
};

// A server stream that writes one message at a time: Next() writes the
// next one or finishes; a failed write ends the stream.
template <typename T>
class OneAtATimeWriter : public grpc::ServerWriteReactor<T> {
 public:
  void OnWriteDone(bool ok) override {
    if (!ok) {
      this->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 protected:
  virtual void Next() = 0;
};

class WeightsReactor : public OneAtATimeWriter<v1::WeightChunk> {
 public:
  WeightsReactor(const std::vector<const WeightBlob*>& blobs, int64_t max_send_bytes)
      : blobs_(blobs), chunk_bytes_(std::min(kWeightChunkBytes, static_cast<size_t>(max_send_bytes / 2))) {
    Next();
  }

 private:
  void Next() override {
    if (blob_ >= blobs_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const WeightBlob& b = *blobs_[blob_];
    const size_t n = std::min(chunk_bytes_, b.bytes.size() - offset_);
    msg_.Clear();
    v1::TensorRef* ref = msg_.mutable_tensor();
    ref->set_name(b.name);
    for (int64_t d : b.shape) ref->add_shape(d);
    ref->set_dtype(ToWire(b.dtype));
    ref->set_inline_data(b.bytes.data() + offset_, n);
    msg_.set_offset(offset_);
    msg_.set_total_bytes(b.bytes.size());
    offset_ += n;
    if (offset_ >= b.bytes.size()) {
      ++blob_;
      offset_ = 0;
    }
    StartWrite(&msg_);
  }
  std::vector<const WeightBlob*> blobs_;
  size_t chunk_bytes_;
  size_t blob_ = 0;
  size_t offset_ = 0;
  v1::WeightChunk msg_;
};

// Streams the eval set: its progress while it is being generated, else
// one chunk per batch.
class EvalSetReactor : public OneAtATimeWriter<v1::EvalSetChunk> {
 public:
  EvalSetReactor(const EvalSetProgress& progress, std::vector<std::shared_ptr<const PayloadBuffer>> batches,
                 int64_t max_send_bytes)
      : progress_(progress), batches_(std::move(batches)), max_send_bytes_(max_send_bytes) {
    Next();
  }
 private:
  void Next() override {
    const bool ready = progress_.ready;
    if ((ready && next_ >= batches_.size()) || (!ready && next_ > 0)) {
      Finish(grpc::Status::OK);
      return;
    }
    msg_.Clear();
    msg_.set_prompts(static_cast<int32_t>(progress_.prompts));
    msg_.set_generated(static_cast<int32_t>(progress_.generated));
    msg_.set_ready(ready);
    msg_.set_batch_count(static_cast<int32_t>(batches_.size()));
    if (ready) {
      msg_.set_batch_index(static_cast<int32_t>(next_));
      v1::BatchDescriptor* d = msg_.mutable_batch();
      d->set_version(v1::PROTOCOL_VERSION_CURRENT);
      d->set_batch_id(static_cast<int64_t>(next_));
      DescribePayload(*batches_[next_], d);
      d->set_num_tokens(batches_[next_]->tensors().front().shape.front());
      grpc::Status size = CheckOutgoing(msg_, max_send_bytes_, absl::StrCat("eval batch ", next_));
      if (!size.ok()) {
        Finish(size);
        return;
      }
    }
    ++next_;
    StartWrite(&msg_);
  }
  EvalSetProgress progress_;
  std::vector<std::shared_ptr<const PayloadBuffer>> batches_;
  int64_t max_send_bytes_;
  size_t next_ = 0;
  v1::EvalSetChunk msg_;
};

}  // namespace

TeacherServiceImpl::~TeacherServiceImpl() {
  std::unique_lock<std::mutex> lock(generate_mu_);
  generate_cv_.wait(lock, [this] { return generating_ == 0; });
}

void ApplyMessageLimits(const MessageLimits& limits, grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(static_cast<int>(limits.max_receive_bytes));
  builder->SetMaxSendMessageSize(static_cast<int>(limits.max_send_bytes));
}

grpc::Status TeacherServiceImpl::Authorize(const grpc::CallbackServerContext* ctx) const {
  return options_.auth != nullptr ? options_.auth->Authorize(*ctx) : grpc::Status::OK;
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), std::string(s.message()));
}

absl::StatusOr<std::unique_ptr<TeacherServiceImpl>> TeacherServiceImpl::Create(
    StudentGroups* groups, CausalLM* model, const VocabMap* vocab, const Dataset* dataset, TeacherMetrics* metrics,
    ServiceOptions options) {
  auto s = std::unique_ptr<TeacherServiceImpl>(new TeacherServiceImpl());
  s->groups_ = groups;
  s->engine_ = &groups->default_group();
  s->model_ = model;
  s->vocab_ = vocab;
  s->dataset_ = dataset;
  s->metrics_ = metrics;
  s->options_ = std::move(options);
  E3_RETURN_IF_ERROR(CheckMessageSizeCap(s->options_.messages.max_receive_bytes, "--max_receive_message_bytes"));
  E3_RETURN_IF_ERROR(CheckMessageSizeCap(s->options_.messages.max_send_bytes, "--max_send_message_bytes"));
  if (s->options_.max_generate_tokens < 1 || s->options_.max_generate_prompt_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max_generate_new_tokens is ", s->options_.max_generate_tokens,
                                                   " and --max_generate_prompt_tokens is ",
                                                   s->options_.max_generate_prompt_tokens, "; expected both >= 1"));
  }
  s->limits_.vocab_size = model->config().vocab_size;
  s->limits_.max_positions = model->config().max_position_embeddings;
  s->limits_.max_generate_new_tokens = s->options_.max_generate_tokens;
  s->limits_.max_generate_prompt_tokens = s->options_.max_generate_prompt_tokens;
  try {
    std::vector<int64_t> ids = vocab->TargetIds();
    at::Tensor index = torch::tensor(ids, torch::kLong).to(model->lm_head().device());
    s->weights_.push_back(BlobOf("embed_tokens", model->embed_tokens()));
    s->weights_.push_back(BlobOf("target_head", model->lm_head().index_select(0, index)));
    s->weights_.push_back(BlobOf("d2t", torch::tensor(vocab->d2t, torch::kLong)));
    std::vector<uint8_t> t2d = vocab->t2d;
    s->weights_.push_back(
        BlobOf("t2d", torch::from_blob(t2d.data(), {static_cast<int64_t>(t2d.size())}, torch::kUInt8).to(torch::kBool)));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("preparing weights for students: ", e.what_without_backtrace()));
  }
  return s;
}

grpc::ServerUnaryReactor* TeacherServiceImpl::GetInfo(grpc::CallbackServerContext* ctx, const v1::GetInfoRequest* req,
                                                      v1::GetInfoResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return FinishUnary(ctx, auth);
  auto version = CheckProtocolVersion(req->version(), "student");
  if (!version.ok()) return FinishUnary(ctx, ToGrpcStatus(version));
  if (auto s = CheckGetInfoRequest(*req); !s.ok()) return FinishUnary(ctx, ToGrpcStatus(s));
  const ModelConfig& c = model_->config();
  resp->set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::ModelInfo* m = resp->mutable_model();
  m->set_architecture(c.architecture_name);
  m->set_hidden_size(static_cast<int32_t>(c.hidden_size));
  m->set_num_hidden_layers(static_cast<int32_t>(c.num_hidden_layers));
  m->set_num_attention_heads(static_cast<int32_t>(c.num_attention_heads));
  m->set_num_key_value_heads(static_cast<int32_t>(c.num_key_value_heads));
  m->set_head_dim(static_cast<int32_t>(c.head_dim));
  m->set_intermediate_size(static_cast<int32_t>(c.intermediate_size));
  m->set_vocab_size(c.vocab_size);
  m->set_draft_vocab_size(vocab_->draft_vocab_size());
  m->set_rms_norm_eps(c.rms_norm_eps);
  m->set_max_position_embeddings(static_cast<int32_t>(c.max_position_embeddings));
  for (int32_t id : engine_->options().aux_layer_ids) m->add_aux_layer_ids(id);
  auto dtype = FromScalarType(model_->options().dtype);
  m->set_compute_dtype(dtype.ok() ? ToWire(*dtype) : v1::DTYPE_UNSPECIFIED);
  m->set_config_json(c.raw_json);
  m->set_model_dir(options_.model_dir);
  const std::shared_ptr<TpGroup>& tp = model_->options().tp;
  resp->mutable_layout()->set_tp_size(tp ? tp->size() : 1);
  resp->mutable_layout()->set_ep_size(tp ? tp->ep_size() : 1);
  resp->mutable_layout()->set_teacher_ranks(tp ? tp->size() : 1);  // one process per TP rank
  for (TransportKind k : engine_->options().transports) resp->add_transports(ToWire(k));
  resp->set_dataset_samples(dataset_->size());
  resp->set_dataset_tokens(dataset_->stats().total_tokens);
  resp->set_backend(options_.backend);
  resp->set_batches_per_epoch(engine_->batches_per_epoch(std::max(1, req->world_size())));
  resp->set_epochs(engine_->options().epochs);
  resp->set_shm_prefix(engine_->shm_segment_prefix());
  *resp->mutable_data_fingerprint() = FingerprintToWire(engine_->options().fingerprint);
  *resp->mutable_captured() = FeatureRequestToWire(EveryFeature(engine_->options().aux_layer_ids));
  for (const std::string& group : groups_->names()) resp->add_student_groups(group);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerWriteReactor<v1::BatchDescriptor>* TeacherServiceImpl::Subscribe(grpc::CallbackServerContext* ctx,
                                                                              const v1::SubscribeRequest* req) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return new ErrorWriteReactor<v1::BatchDescriptor>(auth);
  auto version = CheckProtocolVersion(req->version(), "student");
  if (!version.ok()) return new ErrorWriteReactor<v1::BatchDescriptor>(ToGrpcStatus(version));
  if (auto s = CheckSubscribeRequest(*req, limits_); !s.ok()) {
    return new ErrorWriteReactor<v1::BatchDescriptor>(ToGrpcStatus(s));
  }
  absl::StatusOr<Engine*> engine = groups_->Find(req->student_group());
  if (!engine.ok()) return new ErrorWriteReactor<v1::BatchDescriptor>(ToGrpcStatus(engine.status()));
  std::vector<TransportKind> accepted;
  for (int t : req->accepted_transports()) {
    auto kind = FromWire(static_cast<v1::Transport>(t));
    if (kind.ok()) accepted.push_back(*kind);
  }
  Placement placement;
  // The student's claim of a host name, and the connection's own evidence:
  // shm and CUDA IPC go only to a peer on one of this machine's addresses.
  placement.same_host =
      !req->host().empty() && req->host() == options_.hostname && PeerIsThisHost(ctx->peer());
  const at::Device device = model_->options().device;
  placement.teacher_on_gpu = device.is_cuda() && CudaRuntimeAvailable();
  placement.student_on_gpu = req->student_on_gpu();
  placement.nccl_unique_id = !req->nccl_unique_id().empty();
  // Device indices name the same GPU when both processes see the host's
  // devices in the same order (no differing CUDA_VISIBLE_DEVICES).
  placement.same_gpu = placement.same_host && placement.teacher_on_gpu && placement.student_on_gpu &&
                       req->student_device() == (device.has_index() ? device.index() : 0);
  auto transport = NegotiateTransport(engine_->options().transports, accepted, placement);
  if (!transport.ok()) return new ErrorWriteReactor<v1::BatchDescriptor>(ToGrpcStatus(transport.status()));
  std::unique_ptr<NcclSender> nccl;
  if (*transport == TransportKind::kNccl) {
    // Joins the student's communicator; the first send waits for it.
    auto channel = NcclChannel::Create(req->nccl_unique_id(), NcclChannel::kTeacherRank,
                                       device.has_index() ? device.index() : 0);
    if (!channel.ok()) {
      return new ErrorWriteReactor<v1::BatchDescriptor>(grpc::Status(
          grpc::StatusCode::UNAVAILABLE, absl::StrCat("NCCL channel: ", std::string(channel.status().message()))));
    }
    nccl = std::make_unique<NcclSender>(std::move(channel).value(), engine_->options().subscriber_timeout);
  }
  SubscribeParams p;
  p.subscriber_id = req->subscriber_id();
  p.rank = req->rank();
  p.world_size = req->world_size();
  p.credit_window = req->credit_window() > 0 ? req->credit_window() : 4;
  p.resume = {req->resume().epoch(), req->resume().next_batch()};
  p.transport = *transport;
  if (req->has_resume_fingerprint()) p.fingerprint = FingerprintFromWire(req->resume_fingerprint());
  if (req->has_committed()) p.committed = Cursor{req->committed().epoch(), req->committed().next_batch()};
  if (req->has_features()) p.features = FeatureRequestFromWire(req->features());
  auto generation = (*engine)->Subscribe(p);
  if (!generation.ok()) return new ErrorWriteReactor<v1::BatchDescriptor>(ToGrpcStatus(generation.status()));
  return new SubscribeReactor(ctx, *engine, metrics_, &open_streams_, p.rank, *generation, std::move(nccl),
                              options_.messages.max_send_bytes);
}

grpc::ServerUnaryReactor* TeacherServiceImpl::Ack(grpc::CallbackServerContext* ctx, const v1::AckRequest* req,
                                                  v1::AckResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return FinishUnary(ctx, auth);
  auto version = CheckProtocolVersion(req->version(), "student");
  if (!version.ok()) return FinishUnary(ctx, ToGrpcStatus(version));
  if (auto s = CheckAckRequest(*req, limits_); !s.ok()) return FinishUnary(ctx, ToGrpcStatus(s));
  AckParams a;
  a.rank = req->rank();
  a.subscriber_id = req->subscriber_id();
  a.generation = req->subscription_generation();
  a.batch_ids.assign(req->batch_ids().begin(), req->batch_ids().end());
  if (req->has_committed()) a.committed = Cursor{req->committed().epoch(), req->committed().next_batch()};
  a.final_report = req->final_report();
  absl::StatusOr<Engine*> engine = groups_->Find(req->student_group());
  if (!engine.ok()) return FinishUnary(ctx, ToGrpcStatus(engine.status()));
  auto credits = (*engine)->Ack(a);
  if (!credits.ok()) return FinishUnary(ctx, ToGrpcStatus(credits.status()));
  resp->set_credits(*credits);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerWriteReactor<v1::WeightChunk>* TeacherServiceImpl::GetWeights(grpc::CallbackServerContext* ctx,
                                                                          const v1::GetWeightsRequest* req) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return new ErrorWriteReactor<v1::WeightChunk>(auth);
  auto version = CheckProtocolVersion(req->version(), "student");
  if (!version.ok()) return new ErrorWriteReactor<v1::WeightChunk>(ToGrpcStatus(version));
  if (auto s = CheckGetWeightsRequest(*req, limits_); !s.ok()) return new ErrorWriteReactor<v1::WeightChunk>(ToGrpcStatus(s));
  std::vector<const WeightBlob*> blobs;
  for (const auto& b : weights_) {
    bool wanted = req->names().empty();
    for (const auto& n : req->names()) wanted |= (n == b.name);
    if (wanted) blobs.push_back(&b);
  }
  for (const auto& n : req->names()) {
    bool found = n == "target_head_rest";
    for (const auto& b : weights_) found |= (b.name == n);
    if (!found) {
      return new ErrorWriteReactor<v1::WeightChunk>(grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("no weight \"", n, "\"; served: embed_tokens, target_head, d2t, t2d, target_head_rest")));
    }
    if (n == "target_head_rest") {
      absl::StatusOr<const WeightBlob*> rest = RestHead();
      if (!rest.ok()) return new ErrorWriteReactor<v1::WeightChunk>(ToGrpcStatus(rest.status()));
      blobs.push_back(*rest);
    }
  }
  return new WeightsReactor(blobs, options_.messages.max_send_bytes);
}

absl::StatusOr<const WeightBlob*> TeacherServiceImpl::RestHead() {
  std::lock_guard<std::mutex> lock(rest_head_mu_);
  if (rest_head_ != nullptr) return rest_head_.get();
  try {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < vocab_->t2d.size(); ++i) {
      if (vocab_->t2d[i] == 0) ids.push_back(static_cast<int64_t>(i));
    }
    at::Tensor index = torch::tensor(ids, torch::kLong).to(model_->lm_head().device());
    rest_head_ = std::make_unique<WeightBlob>(BlobOf("target_head_rest", model_->lm_head().index_select(0, index)));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("preparing target_head_rest: ", e.what_without_backtrace()));
  }
  return rest_head_.get();
}

grpc::ServerWriteReactor<v1::EvalSetChunk>* TeacherServiceImpl::GetEvalSet(grpc::CallbackServerContext* ctx,
                                                                           const v1::GetEvalSetRequest* req) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return new ErrorWriteReactor<v1::EvalSetChunk>(auth);
  auto version = CheckProtocolVersion(req->version(), "client");
  if (!version.ok()) return new ErrorWriteReactor<v1::EvalSetChunk>(ToGrpcStatus(version));
  if (auto s = CheckGetEvalSetRequest(*req, limits_); !s.ok()) {
    return new ErrorWriteReactor<v1::EvalSetChunk>(ToGrpcStatus(s));
  }
  if (eval_set_ == nullptr) {
    return new ErrorWriteReactor<v1::EvalSetChunk>(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION, "this teacher has no eval set (start it with --eval_prompts)"));
  }
  // The eval set's aux states are of the captured layers; a student gets
  // its own, as with its batches.
  const std::vector<int32_t>& captured = engine_->options().aux_layer_ids;
  absl::StatusOr<std::vector<int64_t>> positions = AuxPositions(
      req->has_features() ? FeatureRequestFromWire(req->features()).aux_layer_ids : captured, captured);
  if (!positions.ok()) return new ErrorWriteReactor<v1::EvalSetChunk>(ToGrpcStatus(positions.status()));
  const EvalSetProgress progress = eval_set_->progress();
  if (!progress.error.ok()) {
    return new ErrorWriteReactor<v1::EvalSetChunk>(
        ToGrpcStatus(absl::Status(progress.error.code(), absl::StrCat("the eval set failed: ", progress.error.message()))));
  }
  std::vector<std::shared_ptr<const PayloadBuffer>> batches;
  if (progress.ready) {
    absl::StatusOr<std::vector<std::shared_ptr<const PayloadBuffer>>> sliced = eval_set_->batches(*positions);
    if (!sliced.ok()) return new ErrorWriteReactor<v1::EvalSetChunk>(ToGrpcStatus(sliced.status()));
    batches = std::move(sliced).value();
  }
  return new EvalSetReactor(progress, std::move(batches), options_.messages.max_send_bytes);
}

grpc::ServerUnaryReactor* TeacherServiceImpl::Generate(grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req,
                                                       v1::GenerateResponse* resp) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) return FinishUnary(ctx, auth);
  auto version = CheckProtocolVersion(req->version(), "client");
  if (!version.ok()) return FinishUnary(ctx, ToGrpcStatus(version));
  if (auto s = CheckGenerateRequest(*req, limits_); !s.ok()) return FinishUnary(ctx, ToGrpcStatus(s));
  const ModelConfig& c = model_->config();
  const int64_t max_new = req->max_new_tokens();
  {
    std::lock_guard<std::mutex> lock(generate_mu_);
    if (generating_ >= options_.max_concurrent_generate) {
      return FinishUnary(ctx, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                           absl::StrCat(generating_, " Generate calls already running")));
    }
    ++generating_;
  }
  auto* reactor = ctx->DefaultReactor();
  std::vector<int32_t> ids(req->input_ids().begin(), req->input_ids().end());
  // Greedy decoding with a KV cache (generation.h), on its own thread: the
  // model serialises it with the engine's forwards (serialized_model.h).
  std::thread([this, reactor, resp, ids, max_new, &c]() mutable {
    // Counted so the service outlives every Generate thread.
    struct Done {
      TeacherServiceImpl* s;
      ~Done() {
        std::lock_guard<std::mutex> lock(s->generate_mu_);
        --s->generating_;
        s->generate_cv_.notify_all();
      }
    } done{this};
    GenerationOptions g;
    g.max_new_tokens = max_new;
    g.stop_ids.assign(c.eos_token_ids.begin(), c.eos_token_ids.end());
    auto out = GenerateContinuations(*model_, {ids}, g);
    if (!out.ok()) {
      reactor->Finish(ToGrpcStatus(out.status()));
      return;
    }
    for (int32_t t : out->front()) resp->add_output_ids(t);
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

}  // namespace e3
