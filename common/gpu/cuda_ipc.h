// The student's side of the CUDA IPC transport: maps the teacher's payload
// buffers (by their cudaIpcMemHandle_t) into this process once each, and
// copies a payload out of a mapped buffer into the student's own memory,
// after which the teacher may reuse the buffer (the ack recycles it).
#ifndef E3_COMMON_GPU_CUDA_IPC_H_
#define E3_COMMON_GPU_CUDA_IPC_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace e3 {

class CudaIpcImporter {
 public:
  // `device` is the GPU this process copies to (its current device for
  // the mappings).
  explicit CudaIpcImporter(int device) : device_(device) {}
  ~CudaIpcImporter();  // closes every mapping
  CudaIpcImporter(const CudaIpcImporter&) = delete;
  CudaIpcImporter& operator=(const CudaIpcImporter&) = delete;

  // Copies [offset, offset + bytes) of the teacher buffer `handle` to `dst`
  // (memory on this importer's device) and waits for the copy.
  absl::Status CopyOut(const std::string& handle, size_t offset, size_t bytes, void* dst);
  size_t mapped_buffers() const;

 private:
  absl::StatusOr<const uint8_t*> Map(const std::string& handle);
  const int device_;
  mutable std::mutex mu_;
  std::map<std::string, void*> mapped_;
};

}  // namespace e3

#endif  // E3_COMMON_GPU_CUDA_IPC_H_
