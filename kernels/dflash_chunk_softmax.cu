// The softmax of one chunk of DFlash's block attention, context part
// (see student_ops.h): one block per score row. The forward's first pass
// keeps a running max and sum of exponentials over the row's seen keys
// (online softmax), the second rereads the row (mostly from L2) and
// writes the 16-bit probabilities; the backward is one element-wise pass.
// The scores come straight from the GEMM's fp32 output, unscaled and
// unmasked: the scale and the key limit are applied here, so the row is
// read once or twice and written once, in the 16-bit dtype the next GEMM
// reads.
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;

// The max over the block, returned to every thread (as BlockSum).
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? warp_max[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int64_t SeenKeys(const int64_t* limits, int64_t period, int64_t keys) {
  const int64_t n = limits[blockIdx.x % period];
  return n < 0 ? 0 : (n < keys ? n : keys);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ChunkSoftmaxForwardKernel(const float* __restrict__ scores,
                                                                     const int64_t* __restrict__ limits,
                                                                     int64_t period, int64_t keys, float scale,
                                                                     T* __restrict__ probs, float* __restrict__ lse) {
  const int64_t n = SeenKeys(limits, period, keys);
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * keys;
  float m = -INFINITY, sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float z = row[j] * scale;
    if (z > m) {
      sum *= expf(m - z);  // 0 while m is -inf: sum is 0 then
      m = z;
    }
    sum += expf(z - m);
  }
  const float row_max = BlockMax(m);
  const float total = BlockSum(m == -INFINITY ? 0.f : sum * expf(m - row_max));
  const float l = n == 0 ? -INFINITY : row_max + logf(total);
  if (threadIdx.x == 0) lse[blockIdx.x] = l;
  T* out = probs + static_cast<int64_t>(blockIdx.x) * keys;
  for (int64_t j = threadIdx.x; j < keys; j += kThreads) {
    out[j] = Num<T>::FromF(j < n ? expf(row[j] * scale - l) : 0.f);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ChunkSoftmaxBackwardKernel(
    const float* __restrict__ scores, const float* __restrict__ dp, const float* __restrict__ lse,
    const float* __restrict__ delta, const int64_t* __restrict__ limits, int64_t period, int64_t keys, float scale,
    T* __restrict__ probs, T* __restrict__ dscores) {
  const int64_t n = SeenKeys(limits, period, keys);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * keys;
  const float l = lse[blockIdx.x], d = delta[blockIdx.x];
  for (int64_t j = threadIdx.x; j < keys; j += kThreads) {
    const float p = j < n ? expf(scores[base + j] * scale - l) : 0.f;
    probs[base + j] = Num<T>::FromF(p);
    dscores[base + j] = Num<T>::FromF(p * (dp[base + j] - d) * scale);
  }
}

bool RowsFit(int64_t rows, int64_t period) { return rows > 0 && rows <= 0x7fffffff && period > 0; }

}  // namespace

bool DFlashChunkSoftmaxForward(Dtype dtype, const float* scores, const int64_t* limits, int64_t period,
                               int64_t rows, int64_t keys, float scale, void* probs, float* lse, void* stream) {
  if (!RowsFit(rows, period) || keys <= 0) return false;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ChunkSoftmaxForwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, AsStream(stream)>>>(
        scores, limits, period, keys, scale, static_cast<T*>(probs), lse);
    return true;
  });
}

bool DFlashChunkSoftmaxBackward(Dtype dtype, const float* scores, const float* dp, const float* lse,
                                const float* delta, const int64_t* limits, int64_t period, int64_t rows, int64_t keys,
                                float scale, void* probs, void* dscores, void* stream) {
  if (!RowsFit(rows, period) || keys <= 0) return false;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ChunkSoftmaxBackwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, AsStream(stream)>>>(
        scores, dp, lse, delta, limits, period, keys, scale, static_cast<T*>(probs), static_cast<T*>(dscores));
    return true;
  });
}

}  // namespace e3::kernels
