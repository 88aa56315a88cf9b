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

}  // namespace e3

#define E3_CUDA_RETURN_IF_ERROR(expr, what)                    \
  do {                                                         \
    ::absl::Status _e3_cuda_status = ::e3::CudaStatus((expr), what); \
    if (!_e3_cuda_status.ok()) return _e3_cuda_status;         \
  } while (0)

#endif  // E3_WITH_CUDA_RUNTIME
#endif  // E3_COMMON_GPU_CUDA_ERROR_H_
