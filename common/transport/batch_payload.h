// The bytes of one batch as they travel: named tensors laid out at aligned
// offsets in one buffer, which is process memory (sent inline in gRPC), a
// POSIX shm segment (read in place by a student on the host), or GPU memory
// (sent by NCCL, or mapped by a student on the host through CUDA IPC).
#ifndef E3_COMMON_TRANSPORT_BATCH_PAYLOAD_H_
#define E3_COMMON_TRANSPORT_BATCH_PAYLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/dtype.h"
#include "common/transport/shm_segment.h"
#include "common/transport/transport.h"

namespace e3 {

struct PayloadTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  size_t offset = 0;  // within the buffer
  size_t nbytes = 0;
};

// Describes one tensor to copy into a payload.
struct PayloadSource {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
};

struct PayloadLayout {
  std::vector<PayloadTensor> tensors;
  size_t total_bytes = 0;
};

// GPU memory holding a payload (common/gpu/ allocates it). Kept alive by
// the payload that uses it; returned to its pool when released.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual uint8_t* data() const = 0;
  virtual size_t capacity() const = 0;
  virtual int device() const = 0;
  // cudaIpcMemHandle_t bytes of the allocation that starts at data().
  virtual const std::string& ipc_handle() const = 0;
};

class PayloadBuffer {
 public:
  // Offsets of `sources` laid out 64-byte aligned; checks each size.
  static absl::StatusOr<PayloadLayout> LayOut(const std::vector<PayloadSource>& sources);
  // Lays the sources out 64-byte aligned and copies them in. For kShm,
  // `shm_name` names the segment to create.
  static absl::StatusOr<std::unique_ptr<PayloadBuffer>> Build(TransportKind transport,
                                                              const std::vector<PayloadSource>& sources,
                                                              const std::string& shm_name = "");

  // A payload already written to GPU memory (kCudaIpc or kNccl).
  static std::unique_ptr<PayloadBuffer> OnDevice(TransportKind transport, PayloadLayout layout,
                                                 std::shared_ptr<DeviceMemory> memory);

  TransportKind transport() const { return transport_; }
  const std::vector<PayloadTensor>& tensors() const { return tensors_; }
  size_t total_bytes() const { return total_bytes_; }
  // Host bytes; null for a device payload.
  const uint8_t* data() const;
  // Null for a host payload.
  const DeviceMemory* device_memory() const { return device_.get(); }
  const std::string& shm_name() const { return shm_name_; }

 private:
  PayloadBuffer() = default;
  TransportKind transport_ = TransportKind::kInline;
  std::vector<PayloadTensor> tensors_;
  std::vector<uint8_t> bytes_;
  std::unique_ptr<ShmSegment> shm_;
  std::string shm_name_;
  std::shared_ptr<DeviceMemory> device_;
  size_t total_bytes_ = 0;
};

}  // namespace e3

#endif  // E3_COMMON_TRANSPORT_BATCH_PAYLOAD_H_
