// The session with one teacher: connecting, its model info, the recheck
// after a teacher comes back, and starting the stream.
#include "student_trainer/feed/teacher_client.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/stream/student_group.h"
#include "common/torch/tensor_convert.h"
#include "proto/request_limits.h"
#include "proto/subscription_wire.h"
#include "proto/weight_download.h"
#include "proto/wire_codec.h"
#include "student_trainer/feed/teacher_rpc.h"
#include "student_trainer/feed/teacher_wait.h"

namespace e3 {

using teacher_rpc::FromGrpc;
using teacher_rpc::IsFatal;

TeacherClientOptions TeacherClientOptions::FromSettings(const StudentsSettings& s, const ScheduleSettings& schedule) {
  TeacherClientOptions o;
  o.credit_window = static_cast<int>(schedule.credit_window);
  o.group = s.group;
  o.auth.tls_ca = s.tls_ca;
  o.auth.tls_cert = s.tls_cert;
  o.auth.tls_key = s.tls_key;
  o.auth.tls_server_name = s.tls_server_name;
  o.auth.auth_token_file = s.auth_token_file;
  o.max_attempts = static_cast<int>(s.connect_attempts);
  o.initial_backoff = absl::Seconds(s.initial_backoff_s);
  o.teacher_wait = absl::Seconds(s.teacher_wait_s);
  o.keepalive.ping_every = std::chrono::milliseconds(static_cast<int64_t>(s.keepalive_ping_s * 1000));
  o.keepalive.ping_timeout = std::chrono::milliseconds(static_cast<int64_t>(s.keepalive_timeout_s * 1000));
  o.max_receive_message_bytes = s.max_receive_message_bytes;
  o.max_weights_bytes = s.max_weights_bytes;
  return o;
}

std::unique_ptr<grpc::ClientContext> TeacherClient::NewContext(bool with_deadline) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (with_deadline) ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  if (auth_ != nullptr) auth_->Attach(ctx.get());
  return ctx;
}

namespace {

// An error unless the teacher serves `group` (every teacher serves the
// default one).
absl::Status CheckGroupServed(const v1::GetInfoResponse& resp, const std::string& group, const std::string& address) {
  if (group.empty()) return absl::OkStatus();
  for (const std::string& served : resp.student_groups()) {
    if (served == group) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "teacher at ", address, " serves no ", DescribeStudentGroup(group),
      " (--student_group); it serves the default group",
      resp.student_groups().empty() ? std::string() : absl::StrCat(" and ", absl::StrJoin(resp.student_groups(), ", ")),
      ": start it with --student_groups=", group));
}

}  // namespace

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
  req.set_world_size(options_.layout.world_size());
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
  info.captured_layer_ids.assign(resp.model().aux_layer_ids().begin(), resp.model().aux_layer_ids().end());
  info.aux_layer_ids = info.captured_layer_ids;
  info.draft_vocab_size = resp.model().draft_vocab_size();
  info.batches_per_epoch = resp.batches_per_epoch();
  info.epochs = resp.epochs();
  info.fingerprint = FingerprintFromWire(resp.data_fingerprint());
  info.target = IdentifyTarget(info.config, resp.model().model_dir());
  E3_RETURN_IF_ERROR(CheckGroupServed(resp, options_.group, options_.address));
  E3_RETURN_IF_ERROR(ApplyFeatures(&info));
  return info;
}

absl::Status TeacherClient::ApplyFeatures(TeacherInfo* info) const {
  if (!features_.has_value()) return absl::OkStatus();
  const FeatureRequest& want = *features_;
  const std::string teacher = absl::StrCat("teacher at ", options_.address);
  if (!info->raw.has_captured() && want.aux_layer_ids != info->captured_layer_ids) {
    // It sends every layer it captures, and the draft reads other ones.
    return absl::FailedPreconditionError(absl::StrCat(
        teacher, " takes no feature request (an older teacher_server): it sends aux layers [",
        absl::StrJoin(info->captured_layer_ids, ", "), "], and this draft reads [",
        absl::StrJoin(want.aux_layer_ids, ", "),
        "]; update the teacher, or give the student its layers (--aux_layer_ids)"));
  }
  absl::StatusOr<std::vector<int64_t>> positions = AuxPositions(want.aux_layer_ids, info->captured_layer_ids);
  if (!positions.ok()) return absl::FailedPreconditionError(absl::StrCat(teacher, ": ", positions.status().message()));
  info->aux_layer_ids = want.aux_layer_ids;
  info->fingerprint = WithFeaturePlan(info->fingerprint, want);
  return absl::OkStatus();
}

absl::Status TeacherClient::RequestFeatures(const FeatureRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reader_.joinable()) return absl::FailedPreconditionError("the feature request comes before streaming");
  features_ = request;
  TeacherInfo info = info_;
  info.aux_layer_ids = info.captured_layer_ids;
  info.fingerprint = FingerprintFromWire(info.raw.data_fingerprint());
  E3_RETURN_IF_ERROR(ApplyFeatures(&info));
  info_ = std::move(info);
  return absl::OkStatus();
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
  E3_RETURN_IF_ERROR(CheckStudentGroupName(options.group, "--student_group (students.group)"));
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

}  // namespace e3
