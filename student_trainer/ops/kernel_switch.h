// How the student's fast-path ops choose between their CUDA kernel
// (kernels/, student_ops.h) and their ATen statement of the same math: the
// kernel where LibTorch has CUDA, the tensor is a bf16/fp16 CUDA tensor on
// an sm_80+ device, the kernel accepts the shape, and the process-wide
// switch is on. Tests turn the switch off to hold each kernel against the
// ATen statement on the same device.
#ifndef E3_STUDENT_TRAINER_OPS_KERNEL_SWITCH_H_
#define E3_STUDENT_TRAINER_OPS_KERNEL_SWITCH_H_

#ifdef E3_HAS_CUDA
#include "common/torch/torch_core.h"
#include "kernels/student_ops.h"
#endif

namespace e3::ops {

// Process-wide (default on).
void SetStudentKernelsEnabled(bool on);
bool StudentKernelsEnabled();
// Kernel launches so far (tests check that a path really ran its kernels).
int64_t StudentKernelLaunches();

#ifdef E3_HAS_CUDA
// The kernels' dtype for t, or false where no kernel may take it.
bool StudentKernelDtype(const at::Tensor& t, kernels::Dtype* out);
// Whether a kernel over fp32 values may take t (the same conditions).
bool StudentKernelTakesFloat(const at::Tensor& t);
// The current CUDA stream of t's device, as the kernels take it.
void* StudentKernelStream(const at::Tensor& t);
// After a launcher accepted its arguments: throws c10::Error naming `what`
// if CUDA reported a launch error, and counts the launch.
void CheckStudentKernelLaunch(const char* what);
#endif

}  // namespace e3::ops

#endif  // E3_STUDENT_TRAINER_OPS_KERNEL_SWITCH_H_
