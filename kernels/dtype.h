// What every kernel interface of kernels/ shares: the 16-bit dtype a
// launcher is given and how a caller reads a launch's error. Plain C++, no
// CUDA headers: the callers (teacher_server/layers, student_trainer/ops)
// include it through teacher_ops.h or student_ops.h.
#ifndef E3_KERNELS_DTYPE_H_
#define E3_KERNELS_DTYPE_H_

namespace e3::kernels {

enum class Dtype { kBFloat16, kFloat16 };

// The error of the last launch on this thread (cudaGetLastError), or null.
const char* TakeLaunchError();

}  // namespace e3::kernels

#endif  // E3_KERNELS_DTYPE_H_
