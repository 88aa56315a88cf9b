#include "common/gpu/cuda_ipc.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_error.h"
#include "common/gpu/cuda_runtime.h"

namespace e3 {

#ifdef E3_WITH_CUDA_RUNTIME

CudaIpcImporter::~CudaIpcImporter() {
  if (mapped_.empty() || cudaSetDevice(device_) != cudaSuccess) return;
  for (auto& [handle, ptr] : mapped_) cudaIpcCloseMemHandle(ptr);
}

absl::StatusOr<const uint8_t*> CudaIpcImporter::Map(const std::string& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mapped_.find(handle);
  if (it != mapped_.end()) return static_cast<const uint8_t*>(it->second);
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::DataLossError(absl::StrCat("CUDA IPC handle has ", handle.size(), " bytes, expected ",
                                            sizeof(cudaIpcMemHandle_t)));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  E3_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  void* ptr = nullptr;
  // Lazy peer access: the teacher's buffer lives on another GPU, which
  // this device then reads over NVLink (or PCIe).
  E3_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess),
                          "cudaIpcOpenMemHandle (is the teacher on this host, and alive?)");
  mapped_[handle] = ptr;
  return static_cast<const uint8_t*>(ptr);
}

absl::Status CudaIpcImporter::CopyOut(const std::string& handle, size_t offset, size_t bytes, void* dst) {
  auto src = Map(handle);
  if (!src.ok()) return src.status();
  return CudaCopy(dst, *src + offset, bytes, device_);
}

#else  // !E3_WITH_CUDA_RUNTIME

CudaIpcImporter::~CudaIpcImporter() = default;
absl::StatusOr<const uint8_t*> CudaIpcImporter::Map(const std::string&) {
  return absl::UnimplementedError("CUDA IPC transport: this build has no CUDA runtime");
}
absl::Status CudaIpcImporter::CopyOut(const std::string&, size_t, size_t, void*) {
  return absl::UnimplementedError("CUDA IPC transport: this build has no CUDA runtime");
}

#endif

size_t CudaIpcImporter::mapped_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_.size();
}

}  // namespace e3
