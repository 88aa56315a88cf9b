#include "student_trainer/feed/teacher_client.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "proto/request_limits.h"
#include "proto/subscription_wire.h"
#include "proto/weight_download.h"
#include "proto/wire_codec.h"
#include "student_trainer/feed/teacher_wait.h"

namespace e3 {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      absl::StrCat(what, ": ", s.error_message()));
}

// Whether `a` is before `b` in stream order.
bool CursorBefore(const StreamCursor& a, const StreamCursor& b) {
  return a.epoch != b.epoch ? a.epoch < b.epoch : a.next_batch < b.next_batch;
}

// An Ack that failed because the teacher is away or restarted, not
// because it refused: UNAVAILABLE and DEADLINE_EXCEEDED (gone or
// unreachable), NOT_FOUND (a restarted teacher this rank has not
// subscribed to yet), ABORTED (a newer subscription: ours, if the reader
// resubscribed meanwhile; the caller tells), CANCELLED.
bool IsAway(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::NOT_FOUND || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::CANCELLED;
}

// The generation an accepted Subscribe announced in its initial
// metadata; 0 when there is none (a refusal).
uint64_t AcceptedGeneration(const grpc::ClientContext& ctx) {
  const auto& metadata = ctx.GetServerInitialMetadata();
  auto it = metadata.find(kSubscriptionGenerationKey);
  if (it == metadata.end()) return 0;
  return ParseSubscriptionGeneration(std::string(it->second.data(), it->second.size())).value_or(0);
}

std::string CursorText(const StreamCursor& c) { return absl::StrCat(c.epoch, ":", c.next_batch); }

// Errors a retry cannot fix: a mismatched build, a refused subscription,
// corrupt data, a message over a size cap (the same message would be
// over it again).
bool IsFatal(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<at::Tensor> ToTensor(const ReceivedTensor& t) {
  E3_ASSIGN_OR_RETURN(at::ScalarType type, ToScalarType(t.dtype));
  try {
    return torch::from_blob(const_cast<uint8_t*>(t.data), t.shape, torch::TensorOptions().dtype(type)).clone();
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat("tensor ", t.name, ": ", e.what_without_backtrace()));
  }
}

}  // namespace

std::unique_ptr<grpc::ClientContext> TeacherClient::NewContext(bool with_deadline) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (with_deadline) ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  if (auth_ != nullptr) auth_->Attach(ctx.get());
  return ctx;
}

std::vector<std::string> ModelDifferences(const TeacherInfo& a, const TeacherInfo& b) {
  std::vector<std::string> differ;
  if (b.config.architecture_name != a.config.architecture_name) differ.push_back("architecture");
  if (b.config.hidden_size != a.config.hidden_size) differ.push_back("hidden_size");
  if (b.config.num_hidden_layers != a.config.num_hidden_layers) differ.push_back("num_hidden_layers");
  if (b.config.vocab_size != a.config.vocab_size) differ.push_back("vocab_size");
  if (b.aux_layer_ids != a.aux_layer_ids) differ.push_back("aux layer ids");
  if (b.draft_vocab_size != a.draft_vocab_size) differ.push_back("draft vocab size");
  return differ;
}

absl::StatusOr<TeacherInfo> TeacherClient::FetchInfo(absl::Duration timeout, grpc::Status* rpc_status) {
  v1::GetInfoRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  req.set_world_size(options_.world_size);
  v1::GetInfoResponse resp;
  auto ctx = NewContext(false);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  *rpc_status = stub_->GetInfo(ctx.get(), req, &resp);
  if (!rpc_status->ok()) return FromGrpc(*rpc_status, absl::StrCat("GetInfo from teacher at ", options_.address));
  E3_RETURN_IF_ERROR(CheckProtocolVersion(resp.version(), "teacher"));
  TeacherInfo info;
  info.raw = resp;
  E3_ASSIGN_OR_RETURN(info.config,
                      ParseModelConfig(resp.model().config_json(), absl::StrCat("teacher ", options_.address, " config.json")));
  // The weights are bounded by the dims in resp.model(); the trainer
  // builds from the parsed config: they must agree.
  if (resp.model().hidden_size() != info.config.hidden_size || resp.model().vocab_size() != info.config.vocab_size) {
    return absl::DataLossError(absl::StrCat("teacher ", options_.address, ": GetInfoResponse.model says hidden_size ",
                                            resp.model().hidden_size(), ", vocab_size ", resp.model().vocab_size(),
                                            " but its config_json says ", info.config.hidden_size, ", ",
                                            info.config.vocab_size));
  }
  info.aux_layer_ids.assign(resp.model().aux_layer_ids().begin(), resp.model().aux_layer_ids().end());
  info.draft_vocab_size = resp.model().draft_vocab_size();
  info.batches_per_epoch = resp.batches_per_epoch();
  info.epochs = resp.epochs();
  info.fingerprint = FingerprintFromWire(resp.data_fingerprint());
  info.target = IdentifyTarget(info.config, resp.model().model_dir());
  return info;
}

absl::StatusOr<std::unique_ptr<TeacherClient>> TeacherClient::Connect(const TeacherClientOptions& options) {
  auto client = std::unique_ptr<TeacherClient>(new TeacherClient(options));
  try {
    client->device_ = at::Device(options.device);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("device '", options.device, "': ", e.what_without_backtrace()));
  }
  if (client->device_.is_cuda()) {
    client->ipc_ = std::make_unique<CudaIpcImporter>(client->device_.has_index() ? client->device_.index() : 0);
  }
  E3_RETURN_IF_ERROR(CheckMessageSizeCap(options.max_receive_message_bytes, "--max_receive_message_bytes"));
  E3_RETURN_IF_ERROR(CheckMessageSizeCap(options.max_send_message_bytes, "max_send_message_bytes"));
  E3_ASSIGN_OR_RETURN(PeerAuth auth, PeerAuth::ForClient(options.auth));
  client->auth_ = std::make_unique<PeerAuth>(std::move(auth));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_receive_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_send_message_bytes));
  client->auth_->AddChannelArguments(&args);
  AddClientKeepalive(options.keepalive, &args);
  // gRPC's own reconnect backoff grows to two minutes; a restarted
  // teacher should be found within max_backoff of coming back.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(std::max<int64_t>(100, absl::ToInt64Milliseconds(options.max_backoff))));
  client->channel_ = grpc::CreateCustomChannel(options.address, client->auth_->ChannelCredentials(), args);
  client->stub_ = v1::TeacherService::NewStub(client->channel_);
  absl::Duration backoff = options.initial_backoff;
  grpc::Status last;
  for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
    absl::StatusOr<TeacherInfo> info = client->FetchInfo(options.rpc_timeout, &last);
    if (last.ok()) {
      if (!info.ok()) return info.status();
      client->info_ = *std::move(info);
      client->shm_prefix_ = client->info_.raw.shm_prefix();
      return client;
    }
    if (IsFatal(last.error_code())) return FromGrpc(last, absl::StrCat("teacher at ", options.address, " refused GetInfo"));
    if (attempt < options.max_attempts) {
      std::fprintf(stderr, "student: teacher at %s not reachable (%s); retry %d/%d in %.1fs\n", options.address.c_str(),
                   last.error_message().c_str(), attempt, options.max_attempts - 1, absl::ToDoubleSeconds(backoff));
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(backoff));
      backoff *= 2;
    }
  }
  return absl::UnavailableError(absl::StrCat("teacher at ", options.address, " unreachable after ", options.max_attempts,
                                             " attempts: ", last.error_message()));
}

absl::Status TeacherClient::RecheckTeacher() {
  grpc::Status rpc;
  // A short deadline: an unreachable teacher (a frozen link) must not
  // hold the retry loop for the whole rpc_timeout.
  absl::StatusOr<TeacherInfo> now = FetchInfo(std::min(options_.rpc_timeout, absl::Seconds(10)), &rpc);
  if (!rpc.ok()) return now.status();
  if (!now.ok()) return absl::FailedPreconditionError(std::string(now.status().message()));
  const std::vector<std::string> differ = ModelDifferences(info_, *now);
  if (!differ.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("teacher at ", options_.address,
                                                      " came back serving another model (",
                                                      absl::StrJoin(differ, ", "), " differ)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  E3_RETURN_IF_ERROR(CheckSameDataStream(
      stream_fingerprint_, now->fingerprint,
      absl::StrCat("teacher at ", options_.address, " came back serving other data: this student's cursor ",
                   consumed_.epoch, ":", consumed_.next_batch)));
  shm_prefix_ = now->raw.shm_prefix();
  return absl::OkStatus();
}

TeacherClient::~TeacherClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (active_ != nullptr) active_->TryCancel();
    if (nccl_ != nullptr) nccl_->Cancel();  // a receive in progress returns at once
  }
  cv_.notify_all();
  if (reader_.joinable()) reader_.join();
}

absl::StatusOr<EvalSetFetch> TeacherClient::FetchEvalSet() {
  v1::GetEvalSetRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  // The whole set in one stream (about 100 MB per batch on an 8B target):
  // a generous deadline of its own instead of the per-call one.
  auto ctx = NewContext(false);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub_->GetEvalSet(ctx.get(), req);
  EvalSetFetch out;
  v1::EvalSetChunk chunk;
  std::vector<v1::EvalSetChunk> chunks;
  while (reader->Read(&chunk)) chunks.push_back(chunk);
  grpc::Status st = reader->Finish();
  if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) return out;  // no eval set there
  if (!st.ok()) return FromGrpc(st, absl::StrCat("GetEvalSet from ", options_.address));
  if (chunks.empty()) return absl::DataLossError(absl::StrCat("GetEvalSet from ", options_.address, ": no message"));
  out.available = true;
  out.prompts = chunks[0].prompts();
  out.generated = chunks[0].generated();
  out.ready = chunks[0].ready();
  if (!out.ready) return out;
  for (const v1::EvalSetChunk& c : chunks) {
    E3_RETURN_IF_ERROR(CheckProtocolVersion(c.batch().version(), "teacher"));
    std::string prefix;
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefix = shm_prefix_;
    }
    E3_ASSIGN_OR_RETURN(auto received, ReceivedBatch::Resolve(c.batch(), prefix));
    auto get = [&](const char* name) -> absl::StatusOr<at::Tensor> {
      E3_ASSIGN_OR_RETURN(ReceivedTensor t, received->Get(name));
      return ToTensor(t);
    };
    E3_ASSIGN_OR_RETURN(at::Tensor ids, get("input_ids"));
    E3_ASSIGN_OR_RETURN(at::Tensor cu, get("cu_seqlens"));
    E3_ASSIGN_OR_RETURN(at::Tensor mask, get("loss_mask"));
    E3_ASSIGN_OR_RETURN(at::Tensor aux, get("aux_hidden"));
    E3_ASSIGN_OR_RETURN(EvalBatch b, EvalBatchFromWire(ids, cu, mask, aux));
    out.batches.push_back(std::move(b));
  }
  if (static_cast<int>(out.batches.size()) != chunks[0].batch_count()) {
    return absl::DataLossError(absl::StrCat("GetEvalSet from ", options_.address, ": ", out.batches.size(),
                                            " batches of ", chunks[0].batch_count()));
  }
  return out;
}

absl::StatusOr<FrozenWeights> TeacherClient::FetchWeights(bool with_rest_head) {
  v1::GetWeightsRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  if (with_rest_head) {
    for (const char* name : {"embed_tokens", "target_head", "d2t", "t2d", "target_head_rest"}) req.add_names(name);
  }
  auto ctx = NewContext(true);
  auto reader = stub_->GetWeights(ctx.get(), req);
  const std::string source = absl::StrCat("GetWeights from ", options_.address);
  E3_ASSIGN_OR_RETURN(auto expected, ExpectedWeightsOf(info_.raw.model()));
  WeightDownload download(std::move(expected), options_.max_weights_bytes, source);
  v1::WeightChunk chunk;
  while (reader->Read(&chunk)) {
    absl::Status added = download.Add(chunk);
    if (!added.ok()) {
      ctx->TryCancel();
      reader->Finish();
      return added;
    }
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return FromGrpc(st, source);
  auto get = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    E3_ASSIGN_OR_RETURN(ReceivedTensor t, download.Get(name));
    return ToTensor(t);
  };
  FrozenWeights w;
  E3_ASSIGN_OR_RETURN(w.embed_tokens, get("embed_tokens"));
  E3_ASSIGN_OR_RETURN(w.target_head, get("target_head"));
  E3_ASSIGN_OR_RETURN(at::Tensor d2t, get("d2t"));
  E3_ASSIGN_OR_RETURN(at::Tensor t2d, get("t2d"));
  d2t = d2t.to(at::kLong).contiguous();
  t2d = t2d.to(at::kByte).contiguous();
  w.vocab.target_vocab_size = t2d.numel();
  w.vocab.d2t.assign(d2t.data_ptr<int64_t>(), d2t.data_ptr<int64_t>() + d2t.numel());
  w.vocab.t2d.assign(t2d.data_ptr<uint8_t>(), t2d.data_ptr<uint8_t>() + t2d.numel());
  E3_RETURN_IF_ERROR(ValidateVocabMap(w.vocab, absl::StrCat("vocab map from teacher ", options_.address)));
  if (with_rest_head) {
    E3_ASSIGN_OR_RETURN(w.target_head_rest, get("target_head_rest"));
    const int64_t rest_rows = w.vocab.target_vocab_size - static_cast<int64_t>(w.vocab.d2t.size());
    if (w.target_head_rest.dim() != 2 || w.target_head_rest.size(0) != rest_rows ||
        w.target_head_rest.size(1) != w.target_head.size(1)) {
      return absl::DataLossError(absl::StrCat("teacher ", options_.address, " sent target_head_rest of shape [",
                                              absl::StrJoin(w.target_head_rest.sizes().vec(), ", "), "], expected [",
                                              rest_rows, ", ", w.target_head.size(1), "]"));
    }
  }
  return w;
}

absl::Status TeacherClient::Start(StreamCursor resume) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reader_.joinable()) return absl::FailedPreconditionError("already streaming");
  E3_RETURN_IF_ERROR(CheckSameDataStream(
      resume.data, info_.fingerprint,
      absl::StrCat("the checkpoint's cursor ", resume.epoch, ":", resume.next_batch, " for teacher ", options_.address)));
  // A fresh cursor takes the teacher's: from now on this student's
  // position means batches of that stream.
  stream_fingerprint_ = resume.data.empty() ? info_.fingerprint : resume.data;
  consumed_ = resume;
  checkpointed_ = resume;  // the first Subscribe reports it; acknowledged_ follows once accepted
  reader_ = std::thread([this] { ReaderLoop(); });
  return absl::OkStatus();
}

DataFingerprint TeacherClient::fingerprint() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stream_fingerprint_;
}

absl::StatusOr<StudentBatch> TeacherClient::Decode(const v1::BatchDescriptor& d) {
  E3_RETURN_IF_ERROR(CheckProtocolVersion(d.version(), "teacher"));
  StudentBatch b;
  b.batch_id = d.batch_id();
  b.epoch = d.epoch();
  b.index = d.index_in_epoch();
  b.end_of_data = d.end_of_data();
  b.num_tokens = d.num_tokens();
  b.sample_ids.assign(d.sample_ids().begin(), d.sample_ids().end());
  if (b.end_of_data) return b;
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefix = shm_prefix_;
  }
  E3_ASSIGN_OR_RETURN(auto received, ReceivedBatch::Resolve(d, prefix));
  E3_ASSIGN_OR_RETURN(b.transport, FromWire(d.transport()));
  at::Tensor block;  // device transports: the whole payload in this GPU's memory
  if (received->on_device()) {
    E3_ASSIGN_OR_RETURN(block, FetchDevicePayload(*received, b.transport));
  }
  auto get = [&](const char* name) -> absl::StatusOr<at::Tensor> {
    E3_ASSIGN_OR_RETURN(ReceivedTensor t, received->Get(name));
    if (!block.defined()) return ToTensor(t);
    E3_ASSIGN_OR_RETURN(at::ScalarType type, ToScalarType(t.dtype));
    try {
      // A typed view of the block: no copy. Offsets are 64-byte aligned.
      return block.narrow(0, static_cast<int64_t>(t.offset), static_cast<int64_t>(t.nbytes)).view(type).view(t.shape);
    } catch (const c10::Error& e) {
      return absl::DataLossError(absl::StrCat("tensor ", t.name, ": ", e.what_without_backtrace()));
    }
  };
  // Host transports: the copies leave shm here, on the reader thread, so
  // the segment can be reclaimed as soon as the batch is acked.
  E3_ASSIGN_OR_RETURN(b.tensors.input_ids, get("input_ids"));
  E3_ASSIGN_OR_RETURN(b.tensors.cu_seqlens, get("cu_seqlens"));
  E3_ASSIGN_OR_RETURN(b.tensors.loss_mask, get("loss_mask"));
  E3_ASSIGN_OR_RETURN(b.tensors.aux_hidden, get("aux_hidden"));
  E3_ASSIGN_OR_RETURN(b.tensors.last_hidden, get("last_hidden"));
  E3_ASSIGN_OR_RETURN(b.tensors.target_argmax, get("target_argmax"));
  if (b.tensors.input_ids.numel() != b.num_tokens) {
    return absl::DataLossError(absl::StrCat("batch ", b.batch_id, ": ", b.tensors.input_ids.numel(),
                                            " input_ids but num_tokens says ", b.num_tokens));
  }
  return b;
}

absl::StatusOr<at::Tensor> TeacherClient::FetchDevicePayload(const ReceivedBatch& received, TransportKind transport) {
  if (!device_.is_cuda()) {
    return absl::FailedPreconditionError("the teacher sent a device payload to a student on the CPU");
  }
  at::Tensor block;
  try {
    block = torch::empty({static_cast<int64_t>(received.payload_bytes())},
                         torch::TensorOptions().dtype(at::kByte).device(device_));
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating ", received.payload_bytes(), " bytes on ",
                                                     device_.str(), ": ", e.what_without_backtrace()));
  }
  if (transport == TransportKind::kNccl) {
    if (nccl_ == nullptr) return absl::FailedPreconditionError("NCCL payload, but this stream has no NCCL channel");
    E3_RETURN_IF_ERROR(nccl_->Recv(block.data_ptr(), block.numel(), options_.transfer_timeout));
  } else if (transport == TransportKind::kCudaIpc) {
    E3_RETURN_IF_ERROR(ipc_->CopyOut(received.ipc_handle(), 0, block.numel(), block.data_ptr()));
  } else {
    return absl::DataLossError("device payload with a host transport in the descriptor");
  }
  return block;
}

v1::SubscribeRequest TeacherClient::SubscribeRequestFor(const StreamCursor& from, const StreamCursor& committed) {
  v1::SubscribeRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  req.set_rank(options_.rank);
  req.set_world_size(options_.world_size);
  for (TransportKind k : options_.transports) req.add_accepted_transports(ToWire(k));
  req.set_credit_window(options_.credit_window);
  req.mutable_resume()->set_epoch(from.epoch);
  req.mutable_resume()->set_next_batch(from.next_batch);
  req.mutable_committed()->set_epoch(committed.epoch);
  req.mutable_committed()->set_next_batch(committed.next_batch);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stream_fingerprint_.empty()) *req.mutable_resume_fingerprint() = FingerprintToWire(stream_fingerprint_);
  }
  req.set_subscriber_id(options_.subscriber_id);
  req.set_host(options_.host);
  // Device transports: this student receives into GPU memory; for NCCL it
  // makes the communicator's unique id and starts joining now (the teacher
  // joins when it accepts the subscription).
  {
    std::lock_guard<std::mutex> lock(mu_);  // the destructor may Cancel() it
    nccl_.reset();
  }
  const bool wants_nccl =
      std::find(options_.transports.begin(), options_.transports.end(), TransportKind::kNccl) != options_.transports.end();
  if (device_.is_cuda()) {
    const int dev = device_.has_index() ? device_.index() : 0;
    req.set_student_on_gpu(true);
    req.set_student_device(dev);
    if (wants_nccl) {
      auto id = NcclChannel::NewUniqueId();
      auto channel = id.ok() ? NcclChannel::Create(*id, NcclChannel::kStudentRank, dev) : id.status();
      if (channel.ok()) {
        req.set_nccl_unique_id(*id);
        std::lock_guard<std::mutex> lock(mu_);
        nccl_ = std::move(channel).value();
      } else {
        std::fprintf(stderr, "student: NCCL transport unavailable (%s); negotiating without it\n",
                     std::string(channel.status().message()).c_str());
      }
    }
  }
  return req;
}

TeacherClient::StreamResult TeacherClient::StreamOnce(const StreamCursor& from, const StreamCursor& committed) {
  StreamResult result;
  const v1::SubscribeRequest req = SubscribeRequestFor(from, committed);
  grpc::ClientContext ctx;
  auth_->Attach(&ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      result.status = grpc::Status::CANCELLED;
      return result;
    }
    active_ = &ctx;
  }
  auto reader = stub_->Subscribe(&ctx, req);
  // The teacher accepts with the generation in its initial metadata;
  // a refusal ends the call without it.
  reader->WaitForInitialMetadata();
  const uint64_t generation = AcceptedGeneration(ctx);
  if (generation != 0) {
    result.accepted = true;
    std::lock_guard<std::mutex> lock(mu_);
    generation_ = generation;
    last_generation_ = generation;
    // The subscription carried the checkpoint's cursor: committed.
    if (CursorBefore(acknowledged_, committed)) acknowledged_ = committed;
    cv_.notify_all();
  }
  v1::BatchDescriptor d;
  grpc::Status decode_error = grpc::Status::OK;
  // No generation: a refusal (the call is over and Finish says why), or a
  // teacher too old to fence its subscriptions.
  if (generation == 0 && reader->Read(&d)) {
    ctx.TryCancel();
    decode_error = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                "the teacher streams without a subscription generation (an older teacher_server "
                                "build); run teacher and students of the same build");
  }
  while (generation != 0 && reader->Read(&d)) {
    auto batch = Decode(d);
    if (!batch.ok()) {
      // A device transfer that timed out or broke is retried on a new
      // stream; anything else means corrupt data.
      const absl::StatusCode c = batch.status().code();
      const bool transient = c == absl::StatusCode::kDeadlineExceeded || c == absl::StatusCode::kUnavailable ||
                             c == absl::StatusCode::kInternal || c == absl::StatusCode::kCancelled;
      decode_error = grpc::Status(transient ? grpc::StatusCode::UNAVAILABLE : grpc::StatusCode::DATA_LOSS,
                                  std::string(batch.status().message()));
      ctx.TryCancel();
      break;
    }
    batch->generation = generation;
    std::lock_guard<std::mutex> lock(mu_);
    if (batch->end_of_data) {
      result.saw_end = true;
      if (ended_) continue;  // a resubscription after the end: the trainer has had it
    }
    queue_.push_back(std::move(batch).value());
    cv_.notify_all();
  }
  grpc::Status st = reader->Finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = nullptr;
    nccl_.reset();  // aborts a transfer the teacher will never complete
    // A clean end keeps the subscription: the teacher still takes its acks.
    if (!(result.saw_end && st.ok())) generation_ = 0;
    cv_.notify_all();
  }
  result.status = decode_error.ok() ? st : decode_error;
  return result;
}

std::string TeacherClient::StreamFailure(const grpc::Status& st) const {
  return st.ok() ? std::string("the stream ended without the end of data") : st.error_message();
}

void TeacherClient::Fail(absl::Status failure) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_ = std::move(failure);
  cv_.notify_all();
}

bool TeacherClient::NextSubscription(StreamCursor* from, StreamCursor* committed) {
  std::unique_lock<std::mutex> lock(mu_);
  // After the end of data the reader idles; a commit that found the
  // teacher restarted asks for one more subscription to carry it.
  cv_.wait(lock, [this] { return stop_ || !ended_ || resubscribe_; });
  if (stop_) return false;
  resubscribe_ = false;
  if (ended_) {
    // Everything up to the end is queued or trained: subscribe at the end,
    // only to report the commit.
    *from = {info_.epochs, 0, {}};
  } else {
    queue_.clear();  // not yet consumed: the teacher delivers them again
    *from = consumed_;
  }
  *committed = checkpointed_;
  return true;
}

void TeacherClient::ReaderLoop() {
  TeacherWaitOptions w;
  w.address = options_.address;
  w.rank = options_.rank;
  w.limit = options_.teacher_wait;
  w.initial_backoff = options_.initial_backoff;
  w.max_backoff = options_.max_backoff;
  w.progress_every = options_.progress_every;
  TeacherWait wait(w);
  StreamCursor from, committed;
  while (NextSubscription(&from, &committed)) {
    // Back from away: the same model and data stream, or nothing.
    absl::Status same = wait.away() ? RecheckTeacher() : absl::OkStatus();
    if (same.code() == absl::StatusCode::kFailedPrecondition) return Fail(same);
    StreamResult r;
    if (same.ok()) {
      r = StreamOnce(from, committed);
    } else {
      r.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(same.message()));
    }
    if (r.accepted) wait.Accepted(CursorText(from));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      if (r.saw_end) {
        ended_ = true;  // the trainer has every batch; how the stream ended does not matter now
        continue;
      }
    }
    if (!r.status.ok() && IsFatal(r.status.error_code())) {
      return Fail(r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED
                      ? FromGrpc(r.status, absl::StrCat("stream from teacher at ", options_.address,
                                                        " (this student's --max_receive_message_bytes is ",
                                                        options_.max_receive_message_bytes, ")"))
                      : FromGrpc(r.status, absl::StrCat("teacher at ", options_.address, " refused the subscription")));
    }
    StreamCursor resume_at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      resume_at = consumed_;
    }
    absl::StatusOr<absl::Duration> pause = wait.Failed(StreamFailure(r.status), CursorText(resume_at));
    if (!pause.ok()) return Fail(pause.status());
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(*pause), [this] { return stop_; });
    ++reconnects_;
  }
}

absl::StatusOr<StudentBatch> TeacherClient::Next(double* wait_seconds) {
  auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  const auto stopping = [this] { return options_.stop != nullptr && options_.stop->load(); };
  while (!cv_.wait_for(lock, std::chrono::milliseconds(100),
                       [this] { return !queue_.empty() || !failure_.ok() || stop_; })) {
    if (stopping()) return absl::CancelledError("stopped by signal while waiting for a batch");
  }
  if (wait_seconds != nullptr) {
    *wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!queue_.empty()) {
    StudentBatch b = std::move(queue_.front());
    queue_.pop_front();
    if (!b.end_of_data) {
      consumed_.epoch = b.epoch;
      consumed_.next_batch = b.index + 1;
    }
    return b;
  }
  if (!failure_.ok()) return failure_;
  return absl::CancelledError("client stopped");
}

grpc::Status TeacherClient::SendAck(uint64_t generation, const std::vector<int64_t>& batch_ids,
                                    const std::optional<StreamCursor>& committed, bool final_report) {
  v1::AckRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  req.set_subscriber_id(options_.subscriber_id);
  req.set_rank(options_.rank);
  req.set_subscription_generation(generation);
  for (int64_t id : batch_ids) req.add_batch_ids(id);
  if (committed.has_value()) {
    req.mutable_committed()->set_epoch(committed->epoch);
    req.mutable_committed()->set_next_batch(committed->next_batch);
  }
  req.set_final_report(final_report);
  v1::AckResponse resp;
  auto ctx = NewContext(true);
  return stub_->Ack(ctx.get(), req, &resp);
}

void TeacherClient::WaitForNewSubscription(uint64_t generation, absl::Duration d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoNanoseconds(d),
               [&] { return stop_ || !failure_.ok() || generation_ != generation; });
}

absl::Status TeacherClient::Ack(const StudentBatch& batch) {
  const absl::Time deadline = absl::Now() + options_.teacher_wait;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Replaced, or the teacher is gone after the end of data: the
      // teacher dropped that subscription's buffers itself.
      if (generation_ != batch.generation || stop_) return absl::OkStatus();
    }
    const grpc::Status st = SendAck(batch.generation, {batch.batch_id}, std::nullopt);
    if (st.ok()) return absl::OkStatus();
    if (!IsAway(st.error_code())) return FromGrpc(st, absl::StrCat("Ack to ", options_.address));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (generation_ != batch.generation || ended_) return absl::OkStatus();
      // Refused as superseded while this is still our subscription:
      // another student subscribed with this id and rank.
      if (st.error_code() == grpc::StatusCode::ABORTED) return FromGrpc(st, absl::StrCat("Ack to ", options_.address));
    }
    if (absl::Now() >= deadline) return FromGrpc(st, absl::StrCat("Ack to ", options_.address));
    // Until the reader notices the teacher went away and resubscribes.
    WaitForNewSubscription(batch.generation, options_.max_backoff);
  }
}

absl::Status TeacherClient::Commit(const StreamCursor& cursor, bool wait, bool final_report) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!final_report && !CursorBefore(acknowledged_, cursor)) return absl::OkStatus();
    if (CursorBefore(checkpointed_, cursor)) checkpointed_ = cursor;  // every later Subscribe reports it
  }
  const absl::Time deadline = absl::Now() + options_.teacher_wait;
  bool must_send = final_report;
  std::string unsent_because = "no subscription to report it to";
  while (true) {
    uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!must_send && !CursorBefore(acknowledged_, cursor)) return absl::OkStatus();
      if (!failure_.ok()) return failure_;
      if (stop_) return absl::CancelledError("client stopped");
      generation = generation_;
      // A teacher draining on the same signal ended the stream but keeps the
      // subscription: the final report goes to the last one.
      if (generation == 0 && must_send) generation = last_generation_;
    }
    must_send = false;
    if (generation != 0) {
      const grpc::Status st = SendAck(generation, {}, cursor, final_report);
      std::lock_guard<std::mutex> lock(mu_);
      if (st.ok()) {
        if (CursorBefore(acknowledged_, cursor)) acknowledged_ = cursor;
        return absl::OkStatus();
      }
      unsent_because = st.error_message();
      const bool superseded_by_other = st.error_code() == grpc::StatusCode::ABORTED && generation_ == generation;
      if (!IsAway(st.error_code()) || superseded_by_other) {
        return FromGrpc(st, absl::StrCat("commit of ", cursor.epoch, ":", cursor.next_batch, " to ", options_.address));
      }
      if (generation_ == generation && ended_) {
        // The teacher restarted after the end of data: one more
        // subscription carries the commit.
        generation_ = 0;
        resubscribe_ = true;
        cv_.notify_all();
      }
    }
    if (!wait) {  // the next Subscribe carries it
      if (final_report) {
        std::fprintf(stderr,
                     "student: the final commit of %ld:%ld did not reach the teacher at %s (%s); it waits out "
                     "--drain_timeout_s, and a resumed student reports the cursor when it subscribes\n",
                     static_cast<long>(cursor.epoch), static_cast<long>(cursor.next_batch), options_.address.c_str(),
                     unsent_because.c_str());
      }
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("teacher at ", options_.address, " did not take the commit of ",
                                                 cursor.epoch, ":", cursor.next_batch, " within --teacher_wait_s=",
                                                 absl::ToDoubleSeconds(options_.teacher_wait), " (",
                                                 unsent_because, ")"));
    }
    WaitForNewSubscription(generation, options_.max_backoff);
  }
}

}  // namespace e3
