// What a peer can make the teacher do: every request field that sizes
// work, memory or a log line is bounded here, before the handler hands
// anything to the engine. The handlers (teacher_server/service/teacher_service.cc)
// call these first; gRPC's message size caps bound the bytes before that.
// An error names the message, the field, the value and what was expected,
// as InvalidArgument (a retry cannot fix it).
#ifndef E3_PROTO_REQUEST_LIMITS_H_
#define E3_PROTO_REQUEST_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "proto/teacher.pb.h"

namespace e3 {

// A gRPC message size cap, in bytes, as the flags give it (gRPC takes an
// int). InvalidArgument naming `flag` unless 1 KiB <= bytes <= 2 GiB - 1.
absl::Status CheckMessageSizeCap(int64_t bytes, const char* flag);

// Request byte caps of the teacher's server, and the most a batch or a
// weight chunk may weigh on the way out. Requests are small (ids and
// cursors); batches carry hidden states inline when no shm is possible.
struct MessageLimits {
  int64_t max_receive_bytes = 4 << 20;
  int64_t max_send_bytes = 512 << 20;
};

struct RequestLimits {
  // Generate: prompt ids lie in [0, vocab_size); prompt + new tokens fit
  // in max_positions (the model's max_position_embeddings).
  int64_t vocab_size = 0;
  int64_t max_positions = 0;
  int64_t max_generate_new_tokens = 512;
  int64_t max_generate_prompt_tokens = 4096;
  // subscriber_id and host reach logs and the ledger.
  size_t max_name_bytes = 256;
  // Batch ids one Ack may carry (a student acks a few at a time).
  int max_ack_batch_ids = 4096;
  // Names one GetWeights may ask for (the teacher serves a handful).
  int max_weight_names = 16;
  // Aux layers one feature request may name (a draft reads a handful;
  // the refusal of unknown ones lists them).
  int max_feature_layers = 256;
};

absl::Status CheckGetInfoRequest(const v1::GetInfoRequest& req);
// Rank and world within ShardSpec's bounds (so batch ids cannot collide),
// a usable subscriber_id and student group name, a non-negative cursor and
// credit window, an NCCL unique id of NCCL's size, a bounded feature
// request.
absl::Status CheckSubscribeRequest(const v1::SubscribeRequest& req, const RequestLimits& limits);
absl::Status CheckAckRequest(const v1::AckRequest& req, const RequestLimits& limits);
// A bounded feature request.
absl::Status CheckGetEvalSetRequest(const v1::GetEvalSetRequest& req, const RequestLimits& limits);
absl::Status CheckGetWeightsRequest(const v1::GetWeightsRequest& req, const RequestLimits& limits);
// A non-empty prompt of valid ids within the caps, and 1 <= max_new_tokens
// <= the cap, together within the model's positions.
absl::Status CheckGenerateRequest(const v1::GenerateRequest& req, const RequestLimits& limits);

}  // namespace e3

#endif  // E3_PROTO_REQUEST_LIMITS_H_
