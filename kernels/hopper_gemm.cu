// See hopper_gemm.h.
#include "kernels/hopper_gemm.h"

#include "kernels/hopper_gemm_kernel.cuh"

namespace e3::kernels {
namespace {

// Rows walk down 4 pairs of row tiles before moving right: the fastest
// order measured on the lm_head shapes.
constexpr int kGroupM = 4;

// Whether CUDA device `device` runs the kernel (compute capability 9.0).
bool HopperGemmRuns(int device) { return hopper::ResidentClusters<hopper::Epilogue::kArgmax>(device) > 0; }

}  // namespace

bool LinearArgmaxBf16(const void* x, int64_t x_stride, const void* w, int64_t w_stride, int64_t rows, int64_t vocab,
                      int64_t k, void* keys, int32_t* out, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  hopper::EpilogueArgs ep;
  ep.argmax_keys = static_cast<unsigned long long*>(keys);
  if (!hopper::Supports(hopper::Epilogue::kArgmax, rows, vocab, k, x, x_stride, w, w_stride, ep)) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || !HopperGemmRuns(device)) return false;
  // Key 0 is below every real key: an untouched row cannot survive.
  if (cudaMemsetAsync(keys, 0, static_cast<size_t>(rows) * sizeof(unsigned long long), s) != cudaSuccess) {
    cudaGetLastError();  // the caller falls back; its own launch checks must not see this
    return false;
  }
  if (!hopper::Launch<hopper::Epilogue::kArgmax>(static_cast<const __nv_bfloat16*>(x), x_stride,
                                                 static_cast<const __nv_bfloat16*>(w), w_stride, static_cast<int>(rows),
                                                 static_cast<int>(vocab), static_cast<int>(k), ep, kGroupM, s)) {
    return false;
  }
  hopper::KeysToIndex(ep.argmax_keys, out, rows, s);
  return true;
}

}  // namespace e3::kernels
