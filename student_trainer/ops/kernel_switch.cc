#include "student_trainer/ops/kernel_switch.h"

#include <atomic>

#ifdef E3_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace e3::ops {
namespace {

std::atomic<bool> g_enabled{true};
std::atomic<int64_t> g_launches{0};

}  // namespace

void SetStudentKernelsEnabled(bool on) { g_enabled.store(on); }
bool StudentKernelsEnabled() { return g_enabled.load(); }
int64_t StudentKernelLaunches() { return g_launches.load(std::memory_order_relaxed); }

#ifdef E3_HAS_CUDA
bool StudentKernelDtype(const at::Tensor& t, kernels::Dtype* out) {
  if (!g_enabled.load() || !t.defined() || !t.is_cuda()) return false;
  if (at::cuda::getDeviceProperties(t.device().index())->major < 8) return false;
  if (t.scalar_type() == at::kBFloat16) {
    *out = kernels::Dtype::kBFloat16;
    return true;
  }
  if (t.scalar_type() == at::kHalf) {
    *out = kernels::Dtype::kFloat16;
    return true;
  }
  return false;
}

bool StudentKernelTakesFloat(const at::Tensor& t) {
  return g_enabled.load() && t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat &&
         at::cuda::getDeviceProperties(t.device().index())->major >= 8;
}

void* StudentKernelStream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void CheckStudentKernelLaunch(const char* what) {
  const char* err = kernels::TakeLaunchError();
  TORCH_CHECK(err == nullptr, what, " kernel launch failed: ", err);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}
#endif

}  // namespace e3::ops
