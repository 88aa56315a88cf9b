// Conversions between wire messages (teacher.proto) and in-memory types,
// shared by the teacher service and the student client: protocol version
// checks, dtype and transport enums, and tensor references.
#ifndef E3_PROTO_WIRE_CODEC_H_
#define E3_PROTO_WIRE_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/dtype.h"
#include "common/transport/batch_payload.h"
#include "common/transport/shm_segment.h"
#include "common/transport/transport.h"
#include "proto/teacher.pb.h"

namespace e3 {

constexpr int kProtocolVersion = v1::PROTOCOL_VERSION_CURRENT;

// OK when `got` is this build's version; otherwise FailedPrecondition
// naming both versions and `peer` ("student", "teacher").
absl::Status CheckProtocolVersion(int got, const std::string& peer);

v1::DType ToWire(DType dtype);
absl::StatusOr<DType> FromWire(v1::DType dtype);
v1::Transport ToWire(TransportKind kind);
absl::StatusOr<TransportKind> FromWire(v1::Transport transport);

// Describes every tensor of `payload` in `out`: inline bytes copied into
// the message, or shm references.
void DescribePayload(const PayloadBuffer& payload, v1::BatchDescriptor* out);

// A received tensor's bytes, owned (inline) or mapped (shm). For the
// device transports `data` is null: the bytes are [offset, offset + nbytes)
// of the payload block the client fetches (NCCL receive, CUDA IPC copy).
struct ReceivedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  size_t offset = 0;
};

// Resolves a descriptor's tensors. Keeps any shm segments mapped while the
// returned object lives; every size is checked against shape and dtype.
class ReceivedBatch {
 public:
  // Opens the descriptor's shm segments, only those whose names start with
  // `shm_prefix` (the teacher's GetInfo shm_prefix; empty: none at all).
  static absl::StatusOr<std::unique_ptr<ReceivedBatch>> Resolve(v1::BatchDescriptor descriptor,
                                                                const std::string& shm_prefix);
  const v1::BatchDescriptor& descriptor() const { return descriptor_; }
  absl::StatusOr<ReceivedTensor> Get(const std::string& name) const;
  // Device transports: the payload is fetched as one block.
  bool on_device() const { return on_device_; }
  uint64_t payload_bytes() const { return descriptor_.payload_bytes(); }
  const std::string& ipc_handle() const { return ipc_handle_; }  // CUDA IPC only
  int ipc_device() const { return ipc_device_; }

 private:
  bool on_device_ = false;
  std::string ipc_handle_;
  int ipc_device_ = -1;
  v1::BatchDescriptor descriptor_;
  std::vector<ReceivedTensor> tensors_;
  std::vector<std::unique_ptr<ShmSegment>> segments_;
};

}  // namespace e3

#endif  // E3_PROTO_WIRE_CODEC_H_
