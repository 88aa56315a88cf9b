// What the student's kernels share: the 16-bit dtypes as fp32 numbers,
// 16-byte packs, block reductions and launch sizes.
#ifndef E3_STUDENT_TRAINER_KERNELS_KERNEL_COMMON_CUH_
#define E3_STUDENT_TRAINER_KERNELS_KERNEL_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "student_trainer/kernels/student_kernels.h"

namespace e3::student_kernels {

template <typename T>
struct Num;
template <>
struct Num<__nv_bfloat16> {
  static __device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 FromF(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Num<__half> {
  static __device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half FromF(float x) { return __float2half_rn(x); }
};
// fp32 buffers (gradients reduced across ranks) through the same calls.
template <>
struct Num<float> {
  static __device__ __forceinline__ float ToF(float x) { return x; }
  static __device__ __forceinline__ float FromF(float x) { return x; }
};

// The value a tensor of dtype T holds after storing x.
template <typename T>
__device__ __forceinline__ float RoundTo(float x) {
  return Num<T>::ToF(Num<T>::FromF(x));
}

constexpr int kVec = 8;  // 16-bit elements in a 16-byte access

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__host__ __device__ inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum over the block, returned to every thread (blockDim.x a multiple
// of 32, at most 1024). Safe to call repeatedly in one kernel.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float warp_sums[32];
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // earlier readers of warp_sums are done
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0.f;
  return WarpSum(v);
}

// Blocks for `work` items at `threads` per block, capped for grid-stride loops.
inline int64_t GridBlocks(int64_t work, int threads, int64_t cap = 65535) {
  const int64_t b = (work + threads - 1) / threads;
  return b < 1 ? 1 : (b > cap ? cap : b);
}

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// Calls f.template operator()<T>() with T the CUDA type of `dtype`.
template <typename F>
bool DispatchDtype(Dtype dtype, F&& f) {
  if (dtype == Dtype::kBFloat16) return f(__nv_bfloat16{});
  return f(__half{});
}

}  // namespace e3::student_kernels

#endif  // E3_STUDENT_TRAINER_KERNELS_KERNEL_COMMON_CUH_
