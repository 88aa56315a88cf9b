// Internal to common/gpu: turns CUDA runtime and NCCL results into Status.
#ifndef E3_COMMON_GPU_CUDA_ERROR_H_
#define E3_COMMON_GPU_CUDA_ERROR_H_

#ifdef E3_WITH_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace e3 {

inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(err), " (",
                                          cudaGetErrorString(err), ")"));
}

inline absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r),
                                          ")"));
}

// Makes `stream` wait for the work already queued on the current device's
// legacy default stream, where LibTorch runs. Memory LibTorch's caching
// allocator hands out may still be read or written by kernels queued
// there by its previous owner; a transfer on a private stream that writes
// into it must start after them.
inline absl::Status OrderAfterDefaultStream(cudaStream_t stream) {
  cudaEvent_t ev;
  auto st = CudaStatus(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  if (!st.ok()) return st;
  st = CudaStatus(cudaEventRecord(ev, cudaStreamLegacy), "cudaEventRecord (default stream)");
  if (st.ok()) st = CudaStatus(cudaStreamWaitEvent(stream, ev, 0), "cudaStreamWaitEvent");
  cudaEventDestroy(ev);  // released once it completes
  return st;
}

}  // namespace e3

#define E3_CUDA_RETURN_IF_ERROR(expr, what)                    \
  do {                                                         \
    ::absl::Status _e3_cuda_status = ::e3::CudaStatus((expr), what); \
    if (!_e3_cuda_status.ok()) return _e3_cuda_status;         \
  } while (0)

#endif  // E3_WITH_CUDA_RUNTIME
#endif  // E3_COMMON_GPU_CUDA_ERROR_H_
