// See dtype.h.
#include <cuda_runtime.h>

#include "kernels/dtype.h"

namespace e3::kernels {

const char* TakeLaunchError() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace e3::kernels
