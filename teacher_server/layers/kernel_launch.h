// How the layers launch the custom kernels of kernels/ (CUDA builds
// only): on the current stream of the tensor's device, with the launch
// checked right after, so that a failure names the kernel.
#ifndef E3_TEACHER_SERVER_LAYERS_KERNEL_LAUNCH_H_
#define E3_TEACHER_SERVER_LAYERS_KERNEL_LAUNCH_H_

#ifdef E3_HAS_CUDA
#include <c10/cuda/CUDAStream.h>

#include "common/torch/torch_core.h"
#include "kernels/teacher_ops.h"

namespace e3 {

// The kernels' `stream` argument for work on t's device.
inline void* CurrentStream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// Throws c10::Error naming `what` when the kernel was not launched: the
// launcher refused its arguments (`launched` false) or CUDA reported an
// error. The forward's handler turns that into a status.
inline void CheckKernelLaunch(bool launched, const char* what) {
  TORCH_CHECK(launched, what, ": the kernel refused its arguments");
  const char* err = kernels::TakeLaunchError();
  TORCH_CHECK(err == nullptr, what, " kernel launch failed: ", err);
}

}  // namespace e3

#endif  // E3_HAS_CUDA
#endif  // E3_TEACHER_SERVER_LAYERS_KERNEL_LAUNCH_H_
