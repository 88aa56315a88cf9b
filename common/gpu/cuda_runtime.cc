#include "common/gpu/cuda_runtime.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_error.h"

namespace e3 {

#ifdef E3_WITH_CUDA_RUNTIME

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool CudaRuntimeAvailable() { return CudaDeviceCount() > 0; }

int CudaComputeCapability(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

int64_t CudaSharedMemoryPerBlockOptin(int device) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return bytes;
}

std::string CudaDeviceName(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

absl::Status CudaCopy(void* dst, const void* src, size_t bytes, int device) {
  if (bytes == 0) return absl::OkStatus();
  E3_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  // A private stream keeps the copy off the legacy default stream, which
  // the trainer's kernels use: the copy then overlaps with training. It
  // starts after the work queued there so far (see OrderAfterDefaultStream).
  thread_local std::map<int, cudaStream_t> streams;
  cudaStream_t& stream = streams[device];
  if (stream == nullptr) {
    E3_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  auto ordered = OrderAfterDefaultStream(stream);
  if (!ordered.ok()) return ordered;
  E3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a copy");
}

bool CudaPeerAccess(int from_device, int to_device) {
  if (from_device == to_device) return true;
  int ok = 0;
  if (cudaDeviceCanAccessPeer(&ok, from_device, to_device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return ok != 0;
}

#else  // !E3_WITH_CUDA_RUNTIME

int CudaDeviceCount() { return 0; }
int CudaComputeCapability(int) { return 0; }
int64_t CudaSharedMemoryPerBlockOptin(int) { return 0; }
std::string CudaDeviceName(int) { return ""; }
bool CudaRuntimeAvailable() { return false; }
absl::Status CudaCopy(void*, const void*, size_t, int) {
  return absl::UnimplementedError("this build has no CUDA runtime (CUDA toolkit not found at configure time)");
}
bool CudaPeerAccess(int, int) { return false; }

#endif

}  // namespace e3
