// The student's side of TeacherService: connects with retries, fetches the
// frozen weights, and streams batches on a background thread into a
// bounded prefetch queue (so a step never waits on decoding). A broken
// stream (the teacher killed, drained, restarted, or unreachable) is
// resubscribed from the first batch the trainer has not consumed, after
// GetInfo shows the same model and data stream, for up to teacher_wait;
// each Subscribe also carries the last checkpoint cursor, so a commit the
// teacher missed while away lands with it
// (docs/decisions/0013-teacher-restarted-mid-run.md).
#ifndef E3_STUDENT_TRAINER_FEED_TEACHER_CLIENT_H_
#define E3_STUDENT_TRAINER_FEED_TEACHER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/parallel_layout.h"
#include "common/config/run_config.h"
#include "common/data/vocab_map.h"
#include "common/gpu/cuda_ipc.h"
#include "common/gpu/nccl_channel.h"
#include "common/model/model_config.h"
#include "common/model/target_identity.h"
#include "common/rpc/keepalive.h"
#include "common/rpc/peer_auth.h"
#include "common/stream/data_fingerprint.h"
#include "common/stream/feature_request.h"
#include "common/torch/torch_core.h"
#include "common/transport/transport.h"
#include "proto/teacher.grpc.pb.h"
#include "student_trainer/feed/eval_batch.h"
#include "student_trainer/feed/teacher_batch.h"
#include "student_trainer/state/trainer_state.h"

namespace e3 {

class ReceivedBatch;  // proto/wire_codec.h

struct TeacherClientOptions {
  std::string address = "127.0.0.1:50051";
  std::string subscriber_id;
  // The student group this student trains in at the teacher
  // (common/stream/student_group.h); empty: the default group.
  std::string group;
  ParallelLayout layout;  // the student's data-parallel ranks
  int credit_window = 4;  // batches prefetched (and in flight at the teacher)
  std::vector<TransportKind> transports = {TransportKind::kShm, TransportKind::kInline};
  std::string host;  // this machine's name, so the teacher can offer shm and CUDA IPC
  // Where batches land. On a GPU the device transports (NCCL, CUDA IPC)
  // deliver straight into its memory; host transports arrive on the CPU.
  std::string device = "cpu";
  absl::Duration transfer_timeout = absl::Seconds(120);  // one device transfer, the teacher's send included
  absl::Duration rpc_timeout = absl::Seconds(30);
  int max_attempts = 6;  // attempts at the first GetInfo before giving up
  absl::Duration initial_backoff = absl::Milliseconds(500);
  // Once streaming: how long a teacher may stay away (killed and
  // restarted, drained, unreachable) before the run fails; retries back
  // off to max_backoff, and a line is logged every progress_every.
  absl::Duration teacher_wait = absl::Seconds(1800);
  absl::Duration max_backoff = absl::Seconds(2);
  absl::Duration progress_every = absl::Seconds(10);
  PeerAuthOptions auth;  // TLS and the shared token (common/rpc/peer_auth.h)
  KeepaliveOptions keepalive;  // a teacher that stops answering is noticed in seconds
  // Caps on what the teacher can make this student hold: one message (an
  // inline batch; the teacher's default send cap is the same) and the
  // whole GetWeights download, whose tensors must also have the sizes the
  // model dims of GetInfo give (proto/weight_download.h).
  int64_t max_receive_message_bytes = 512 << 20;
  int64_t max_send_message_bytes = 4 << 20;
  uint64_t max_weights_bytes = 64ull << 30;
  // Set by SIGTERM (null: never). Next() stops waiting for a batch once it
  // is set: a teacher drained by the same signal sends no more.
  const std::atomic<bool>* stop = nullptr;

  // The fields that are settings, from the students section and the
  // schedule's credit window; the rest keep their defaults, for the
  // caller to set.
  static TeacherClientOptions FromSettings(const StudentsSettings& students, const ScheduleSettings& schedule);
};

struct TeacherInfo {
  v1::GetInfoResponse raw;
  ModelConfig config;  // parsed from the teacher's config.json
  std::vector<int32_t> captured_layer_ids;  // every layer the teacher captures
  // The layers this client's batches carry, in their order: its feature
  // request's (TeacherClient::RequestFeatures), else every captured one.
  std::vector<int32_t> aux_layer_ids;
  int64_t draft_vocab_size = 0;
  int64_t batches_per_epoch = 0;
  int64_t epochs = 0;
  // Of the data stream it serves, with this client's feature plan (that of
  // everything captured until RequestFeatures).
  DataFingerprint fingerprint;
  TargetIdentity target;        // its model, as a draft's export records it
};

// What differs between two teachers' models as the draft sees them
// (dims, aux layers, draft vocab size); empty when nothing does.
std::vector<std::string> ModelDifferences(const TeacherInfo& a, const TeacherInfo& b);

struct FrozenWeights {
  at::Tensor embed_tokens;  // [V, H]
  at::Tensor target_head;   // [N, H]
  // [V - N, H]: the head's other rows in target id order (FetchWeights'
  // with_rest_head; undefined otherwise).
  at::Tensor target_head_rest;
  VocabMap vocab;
};

struct StudentBatch {
  int64_t batch_id = 0;
  int64_t epoch = 0;
  int64_t index = 0;
  bool end_of_data = false;
  int64_t num_tokens = 0;
  std::vector<int64_t> sample_ids;
  TeacherBatch tensors;  // on the client's device for device transports, else on the CPU
  TransportKind transport = TransportKind::kInline;
  uint64_t generation = 0;  // the subscription that delivered it
};

struct EvalSetFetch {
  bool available = false;  // false: the teacher was started without --eval_prompts
  bool ready = false;
  int prompts = 0, generated = 0;
  std::vector<EvalBatch> batches;  // when ready
};

class TeacherClient {
 public:
  // GetInfo with retries; a protocol mismatch fails at once.
  static absl::StatusOr<std::unique_ptr<TeacherClient>> Connect(const TeacherClientOptions& options);
  ~TeacherClient();

  const TeacherInfo& info() const { return info_; }
  // What the draft reads of every batch (and of the eval set), before
  // Start: from now on the client asks for it at each Subscribe, its
  // info() describes what it receives, and its cursors carry the plan.
  // FailedPrecondition naming the layers when the teacher does not capture
  // them, or cannot send a part of what it captures (an older teacher).
  absl::Status RequestFeatures(const FeatureRequest& request);
  // with_rest_head also fetches target_head_rest (the LK losses).
  absl::StatusOr<FrozenWeights> FetchWeights(bool with_rest_head = false);
  // The teacher's acceptance eval set (teacher --eval_prompts): whether it
  // has one, how far its generation is, and once ready its batches.
  absl::StatusOr<EvalSetFetch> FetchEvalSet();

  // Starts streaming from `resume` (a checkpoint's cursor, or 0:0) on the
  // background thread. A cursor made under another data fingerprint than
  // the teacher's is refused here, naming what differs.
  absl::Status Start(StreamCursor resume);
  // The fingerprint this client's cursor belongs to: the checkpoint's, or
  // the teacher's when the student started fresh.
  DataFingerprint fingerprint() const;
  // The next batch, blocking; `wait_seconds` gets the time spent blocked.
  absl::StatusOr<StudentBatch> Next(double* wait_seconds);
  // Acks a trained batch (frees its buffer at the teacher, returns a
  // credit). A batch of a subscription since replaced needs none: the
  // teacher dropped its buffers when the student resubscribed.
  absl::Status Ack(const StudentBatch& batch);
  // Reports a checkpoint's cursor as committed. Without `wait`, a teacher
  // that is away gets it with the next Subscribe; with it, returns once the
  // teacher has it (at most teacher_wait).
  // `final_report`: the student stops after this commit (a signal); it is
  // sent even when the teacher took this cursor already, and marked as the
  // last word a draining teacher waits for from each rank it served.
  absl::Status Commit(const StreamCursor& cursor, bool wait, bool final_report = false);
  int reconnects() const { return reconnects_; }

 private:
  explicit TeacherClient(TeacherClientOptions options) : options_(std::move(options)) {}
  // GetInfo once, within `timeout`, parsed and checked (this client's
  // group served, its feature request applied).
  absl::StatusOr<TeacherInfo> FetchInfo(absl::Duration timeout, grpc::Status* rpc_status);
  // `info` as this client receives it under features_.
  absl::Status ApplyFeatures(TeacherInfo* info) const;
  // A batch's tensors from `get` (by name): those features_ asks for, or
  // all of them without a request.
  absl::Status DecodeTensors(const std::function<absl::StatusOr<at::Tensor>(const char*)>& get, StudentBatch* b) const;
  // After the teacher was away: the same model and data stream as before?
  // FailedPrecondition (fatal) if not; the transport's error if it is
  // still unreachable.
  absl::Status RecheckTeacher();
  void ReaderLoop();
  // Waits for the next subscription to make (false: stopping) and says
  // where it resumes and what it reports committed.
  bool NextSubscription(StreamCursor* from, StreamCursor* committed);
  // Ends streaming with `failure`, which Next() then returns.
  void Fail(absl::Status failure);
  v1::SubscribeRequest SubscribeRequestFor(const StreamCursor& from, const StreamCursor& committed);
  struct StreamResult {
    grpc::Status status;
    bool accepted = false;  // the teacher sent the subscription's generation
    bool saw_end = false;
  };
  // One Subscribe stream from `from`, reporting `committed`.
  StreamResult StreamOnce(const StreamCursor& from, const StreamCursor& committed);
  // Sends one Ack of `generation`.
  grpc::Status SendAck(uint64_t generation, const std::vector<int64_t>& batch_ids,
                       const std::optional<StreamCursor>& committed, bool final_report = false);
  // Waits (interruptibly) up to `d` or until the subscription changes.
  void WaitForNewSubscription(uint64_t generation, absl::Duration d);
  std::string StreamFailure(const grpc::Status& st) const;
  absl::StatusOr<StudentBatch> Decode(const v1::BatchDescriptor& d);
  // Fetches a device payload (NCCL receive or CUDA IPC copy) into one
  // block of this client's GPU memory.
  absl::StatusOr<at::Tensor> FetchDevicePayload(const ReceivedBatch& received, TransportKind transport);
  std::unique_ptr<grpc::ClientContext> NewContext(bool with_deadline) const;

  TeacherClientOptions options_;
  std::optional<FeatureRequest> features_;  // set once, before streaming
  std::unique_ptr<PeerAuth> auth_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TeacherService::Stub> stub_;
  TeacherInfo info_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StudentBatch> queue_;
  StreamCursor consumed_;  // first batch the trainer has not taken
  StreamCursor checkpointed_;  // the last checkpoint's cursor, sent with every Subscribe
  StreamCursor acknowledged_;  // the furthest commit the teacher confirmed
  DataFingerprint stream_fingerprint_;  // what consumed_ and checkpointed_ belong to
  std::string shm_prefix_;     // the teacher process's segments (a restart changes it)
  // The live subscription's generation; 0 while there is none (a clean
  // end of data keeps it: the teacher still takes its acks).
  uint64_t generation_ = 0;
  uint64_t last_generation_ = 0;  // of the last accepted subscription, kept after its stream ends
  bool ended_ = false;        // the stream delivered the end of data
  bool resubscribe_ = false;  // after the end: a commit needs a new subscription
  absl::Status failure_;
  bool stop_ = false;
  grpc::ClientContext* active_ = nullptr;
  std::thread reader_;
  int reconnects_ = 0;
  at::Device device_{at::kCPU};
  // Device transports, used by the reader thread only. The NCCL channel
  // belongs to one Subscribe stream (a new stream makes a new one).
  std::unique_ptr<NcclChannel> nccl_;
  std::unique_ptr<CudaIpcImporter> ipc_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_FEED_TEACHER_CLIENT_H_
