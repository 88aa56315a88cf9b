// GPU buffers for outgoing payloads (NCCL and CUDA IPC transports). Each
// buffer is its own cudaMalloc allocation, so its CUDA IPC handle maps
// exactly that buffer in a student. A released buffer goes back to the
// pool and is reused by the next payload that fits; buffers are never
// freed while the pool lives, so a handle a student has mapped stays valid.
#ifndef E3_COMMON_GPU_DEVICE_POOL_H_
#define E3_COMMON_GPU_DEVICE_POOL_H_

#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "common/transport/batch_payload.h"

namespace e3 {

class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  // Unimplemented without CUDA; InvalidArgument for a device that is not there.
  static absl::StatusOr<std::shared_ptr<DevicePool>> Create(int device);
  ~DevicePool();

  // A free buffer of at least `bytes` (the smallest that fits), or a new
  // one. The buffer returns to the pool when the last reference drops.
  absl::StatusOr<std::shared_ptr<DeviceMemory>> Acquire(size_t bytes);

  int device() const { return device_; }
  size_t buffers() const;
  size_t bytes_allocated() const;

 private:
  struct Slot;
  class Lease;
  explicit DevicePool(int device);  // defined where Slot is complete
  void Release(Slot* slot);

  const int device_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

// Lays `sources` out as PayloadBuffer::Build does and copies them into a
// pool buffer; sources may be host or device pointers (any device). Returns
// once the bytes are in place, so the payload can be published at once.
absl::StatusOr<std::unique_ptr<PayloadBuffer>> BuildDevicePayload(TransportKind transport,
                                                                  const std::vector<PayloadSource>& sources,
                                                                  DevicePool& pool);

}  // namespace e3

#endif  // E3_COMMON_GPU_DEVICE_POOL_H_
