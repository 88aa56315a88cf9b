// The stream protocol: subscribe from a cursor, read batches into the
// prefetch queue, ack what was trained, commit what was checkpointed, and
// resubscribe when a teacher goes away and comes back.
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
#include "student_trainer/feed/teacher_rpc.h"
#include "student_trainer/feed/teacher_wait.h"

namespace e3 {

using teacher_rpc::FromGrpc;
using teacher_rpc::CursorBefore;
using teacher_rpc::IsAway;
using teacher_rpc::AcceptedGeneration;
using teacher_rpc::CursorText;
using teacher_rpc::IsFatal;

v1::SubscribeRequest TeacherClient::SubscribeRequestFor(const StreamCursor& from, const StreamCursor& committed) {
  v1::SubscribeRequest req;
  req.set_version(v1::PROTOCOL_VERSION_CURRENT);
  req.set_rank(options_.layout.rank());
  req.set_world_size(options_.layout.world_size());
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
  req.set_student_group(options_.group);
  if (features_.has_value()) *req.mutable_features() = FeatureRequestToWire(*features_);
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
  w.rank = options_.layout.rank();
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
  req.set_student_group(options_.group);
  req.set_rank(options_.layout.rank());
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
