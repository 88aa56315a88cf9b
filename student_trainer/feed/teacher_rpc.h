// What the teacher client makes of a teacher's RPC outcomes and payloads,
// shared by its files (teacher_client.cc: the session; teacher_downloads.cc:
// weights and the eval set; batch_decoding.cc: payloads; batch_stream.cc:
// the stream, acks and commits).
#ifndef E3_STUDENT_TRAINER_FEED_TEACHER_RPC_H_
#define E3_STUDENT_TRAINER_FEED_TEACHER_RPC_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"
#include "proto/wire_codec.h"
#include "student_trainer/state/trainer_state.h"

namespace e3::teacher_rpc {

// A gRPC status as an absl one, prefixed with `what`.
absl::Status FromGrpc(const grpc::Status& s, const std::string& what);

// Whether `a` is before `b` in stream order.
bool CursorBefore(const StreamCursor& a, const StreamCursor& b);

// An Ack that failed because the teacher is away or restarted, not
// because it refused: UNAVAILABLE and DEADLINE_EXCEEDED (gone or
// unreachable), NOT_FOUND (a restarted teacher this rank has not
// subscribed to yet), ABORTED (a newer subscription: ours, if the reader
// resubscribed meanwhile; the caller tells), CANCELLED.
bool IsAway(grpc::StatusCode code);

// The generation an accepted Subscribe announced in its initial
// metadata; 0 when there is none (a refusal).
uint64_t AcceptedGeneration(const grpc::ClientContext& ctx);

// "epoch:next_batch", for logs.
std::string CursorText(const StreamCursor& c);

// Errors a retry cannot fix: a mismatched build, a refused subscription,
// corrupt data, a message over a size cap (the same message would be
// over it again).
bool IsFatal(grpc::StatusCode code);

// A received tensor as a LibTorch tensor of its own (a copy).
absl::StatusOr<at::Tensor> ToTensor(const ReceivedTensor& t);

}  // namespace e3::teacher_rpc

#endif  // E3_STUDENT_TRAINER_FEED_TEACHER_RPC_H_
