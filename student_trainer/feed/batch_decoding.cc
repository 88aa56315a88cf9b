// A batch descriptor and its payload, from whichever transport carried
// it, into a StudentBatch on the student's device.
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

using teacher_rpc::ToTensor;

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
  E3_RETURN_IF_ERROR(DecodeTensors(get, &b));
  if (b.tensors.input_ids.numel() != b.num_tokens) {
    return absl::DataLossError(absl::StrCat("batch ", b.batch_id, ": ", b.tensors.input_ids.numel(),
                                            " input_ids but num_tokens says ", b.num_tokens));
  }
  return b;
}

absl::Status TeacherClient::DecodeTensors(const std::function<absl::StatusOr<at::Tensor>(const char*)>& get,
                                          StudentBatch* b) const {
  TeacherBatch& t = b->tensors;
  E3_ASSIGN_OR_RETURN(t.input_ids, get("input_ids"));
  E3_ASSIGN_OR_RETURN(t.cu_seqlens, get("cu_seqlens"));
  E3_ASSIGN_OR_RETURN(t.loss_mask, get("loss_mask"));
  const FeatureRequest wanted = features_.value_or(EveryFeature(info_.captured_layer_ids));
  if (!wanted.aux_layer_ids.empty()) {
    E3_ASSIGN_OR_RETURN(t.aux_hidden, get("aux_hidden"));
    // The draft's fc reads exactly its layers: a teacher that sent others
    // would train it on the wrong states.
    const int64_t width = static_cast<int64_t>(wanted.aux_layer_ids.size()) * info_.config.hidden_size;
    if (t.aux_hidden.dim() != 2 || t.aux_hidden.size(1) != width) {
      return absl::DataLossError(absl::StrCat("batch ", b->batch_id, ": aux_hidden of shape [",
                                              absl::StrJoin(t.aux_hidden.sizes(), ", "), "]; expected [T, ", width,
                                              "] (aux layers [", absl::StrJoin(wanted.aux_layer_ids, ", "),
                                              "] of hidden size ", info_.config.hidden_size, ")"));
    }
  }
  if (wanted.last_hidden) {
    E3_ASSIGN_OR_RETURN(t.last_hidden, get("last_hidden"));
  }
  if (wanted.target_argmax) {
    E3_ASSIGN_OR_RETURN(t.target_argmax, get("target_argmax"));
  }
  return absl::OkStatus();
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

}  // namespace e3
