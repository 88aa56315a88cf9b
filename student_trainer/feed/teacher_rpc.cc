#include "student_trainer/feed/teacher_rpc.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/torch/tensor_convert.h"
#include "proto/subscription_wire.h"

namespace e3::teacher_rpc {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      absl::StrCat(what, ": ", s.error_message()));
}

bool CursorBefore(const StreamCursor& a, const StreamCursor& b) {
  return a.epoch != b.epoch ? a.epoch < b.epoch : a.next_batch < b.next_batch;
}

bool IsAway(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::NOT_FOUND || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::CANCELLED;
}

uint64_t AcceptedGeneration(const grpc::ClientContext& ctx) {
  const auto& metadata = ctx.GetServerInitialMetadata();
  auto it = metadata.find(kSubscriptionGenerationKey);
  if (it == metadata.end()) return 0;
  return ParseSubscriptionGeneration(std::string(it->second.data(), it->second.size())).value_or(0);
}

std::string CursorText(const StreamCursor& c) { return absl::StrCat(c.epoch, ":", c.next_batch); }

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

}  // namespace e3::teacher_rpc
