// What the kernels share: the 16-bit dtypes (and fp32) as fp32 numbers,
// 16-byte packs, warp and block reductions, grid-stride loops, launch
// sizes, and the step from a Dtype to its CUDA type. A helper that one op
// alone uses stays in that op's .cu file.
#ifndef E3_KERNELS_COMMON_CUH_
#define E3_KERNELS_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace e3::kernels {

template <typename T>
struct Num;
template <>
struct Num<__nv_bfloat16> {
  static constexpr bool kIsBf16 = true;
  static __device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 FromF(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ uint16_t Bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
  static __device__ __forceinline__ __nv_bfloat16 FromBits(uint16_t b) { return __ushort_as_bfloat16(b); }
};
template <>
struct Num<__half> {
  static constexpr bool kIsBf16 = false;
  static __device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half FromF(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ uint16_t Bits(__half x) { return __half_as_ushort(x); }
  static __device__ __forceinline__ __half FromBits(uint16_t b) { return __ushort_as_half(b); }
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

// A 16-byte load or store moves 8 elements of a 2-byte dtype, and needs a
// 16-byte aligned address (checked on the host before a vectorised launch).
constexpr int kVec = 8;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__host__ __device__ inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Optional operands (nullptr) do not stop the vectorised path.
inline bool Aligned16OrNull(const void* p) { return p == nullptr || Aligned16(p); }

// Index arithmetic of the hottest element-wise kernels (SiLU-mul, rope):
// 32-bit where every offset fits, which is fewer instructions per pack.
// Both kernels run faster with 32-bit indices (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md), with the
// same output bits. Whether offsets up to `elements` fit:
inline bool FitsUint32(int64_t elements) { return elements >= 0 && elements <= int64_t{0xffffffff}; }

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

// A grid-stride loop's first index for this thread and its step: the
// element-wise kernels cover any size with a capped grid (GridBlocks()).
template <typename Index = int64_t>
__device__ __forceinline__ Index GridStrideStart() {
  return static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
}
template <typename Index = int64_t>
__device__ __forceinline__ Index GridStride() {
  return static_cast<Index>(gridDim.x) * blockDim.x;
}

// The rows a kernel with a device-side row limit processes: the first
// *limit (when it is given and smaller), read once per thread.
__device__ __forceinline__ int64_t LimitedRows(int64_t rows, const int32_t* limit) {
  if (limit == nullptr) return rows;
  const int64_t n = *limit;
  return n < rows ? (n < 0 ? 0 : n) : rows;
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

}  // namespace e3::kernels

#endif  // E3_KERNELS_COMMON_CUH_
