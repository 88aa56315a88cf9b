// gRPC TeacherService over the callback API. Handlers are thin: they
// validate, translate to engine calls, and stream what the engine makes
// (one write in flight per stream is the backpressure).
#ifndef E3_TEACHER_SERVER_SERVICE_TEACHER_SERVICE_H_
#define E3_TEACHER_SERVER_SERVICE_TEACHER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "common/data/vocab_map.h"
#include "common/rpc/peer_auth.h"
#include "proto/request_limits.h"
#include "proto/teacher.grpc.pb.h"
#include "teacher_server/data/eval_set.h"
#include "teacher_server/engine/student_groups.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/service/nccl_sender.h"
#include "teacher_server/service/teacher_metrics.h"

namespace e3 {

// A frozen tensor the student fetches with GetWeights.
struct WeightBlob {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct ServiceOptions {
  std::string backend = "hf";
  std::string hostname;      // compared with the student's to allow shm and CUDA IPC
  std::string model_dir;     // announced in GetInfo: drafts record their target
  int64_t max_generate_tokens = 512;  // a Generate call's max_new_tokens
  int64_t max_generate_prompt_tokens = 4096;
  int max_concurrent_generate = 4;
  // The server's caps (ApplyMessageLimits); batches and weight chunks are
  // checked against max_send_bytes before they are written.
  MessageLimits messages;
  // Every RPC must pass its Authorize (the shared token); null: no token.
  std::shared_ptr<const PeerAuth> auth;
};

// Sets the server's receive and send caps; requests over the receive cap
// are refused by gRPC with RESOURCE_EXHAUSTED before any handler runs.
void ApplyMessageLimits(const MessageLimits& limits, grpc::ServerBuilder* builder);

class TeacherServiceImpl final : public v1::TeacherService::CallbackService {
 public:
  // Builds the weight blobs (embed_tokens, target_head, d2t, t2d) once.
  // Subscriptions and acks go to the engine of their student group.
  static absl::StatusOr<std::unique_ptr<TeacherServiceImpl>> Create(StudentGroups* groups, CausalLM* model,
                                                                    const VocabMap* vocab, const Dataset* dataset,
                                                                    TeacherMetrics* metrics, ServiceOptions options);

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx, const v1::GetInfoRequest* req,
                                    v1::GetInfoResponse* resp) override;
  grpc::ServerWriteReactor<v1::BatchDescriptor>* Subscribe(grpc::CallbackServerContext* ctx,
                                                           const v1::SubscribeRequest* req) override;
  grpc::ServerUnaryReactor* Ack(grpc::CallbackServerContext* ctx, const v1::AckRequest* req,
                                v1::AckResponse* resp) override;
  grpc::ServerWriteReactor<v1::WeightChunk>* GetWeights(grpc::CallbackServerContext* ctx,
                                                        const v1::GetWeightsRequest* req) override;
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req,
                                     v1::GenerateResponse* resp) override;
  grpc::ServerWriteReactor<v1::EvalSetChunk>* GetEvalSet(grpc::CallbackServerContext* ctx,
                                                         const v1::GetEvalSetRequest* req) override;
  // Serves `eval_set` (not owned; null: GetEvalSet says there is none).
  void SetEvalSet(const EvalSet* eval_set) { eval_set_ = eval_set; }

  int open_streams() const { return open_streams_; }
  // Waits for Generate calls still running on their threads.
  ~TeacherServiceImpl() override;

 private:
  TeacherServiceImpl() = default;
  // The shared token's check, first in every handler (common/rpc/peer_auth.h).
  grpc::Status Authorize(const grpc::CallbackServerContext* ctx) const;
  StudentGroups* groups_ = nullptr;
  // The default group's: its options (captured layers, transports, data
  // fingerprint) are every group's.
  Engine* engine_ = nullptr;
  CausalLM* model_ = nullptr;
  const VocabMap* vocab_ = nullptr;
  const Dataset* dataset_ = nullptr;
  TeacherMetrics* metrics_ = nullptr;
  const EvalSet* eval_set_ = nullptr;
  ServiceOptions options_;
  RequestLimits limits_;
  std::vector<WeightBlob> weights_;
  // The target head's rows outside the draft vocab ("target_head_rest"),
  // served only when asked for by name (the LK losses need the target's
  // full normaliser) and built at the first request: they are most of the
  // head, which the soft-CE student never reads.
  absl::StatusOr<const WeightBlob*> RestHead();
  std::mutex rest_head_mu_;
  std::unique_ptr<WeightBlob> rest_head_;
  std::atomic<int> open_streams_{0};
  std::mutex generate_mu_;
  std::condition_variable generate_cv_;
  int generating_ = 0;
};

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_SERVICE_TEACHER_SERVICE_H_
