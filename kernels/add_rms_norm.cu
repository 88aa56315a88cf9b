// Residual add + RMSNorm for the teacher (see teacher_ops.h, AddRmsNorm):
// one block per row, 16-byte accesses (8 bf16/fp16 elements), fp32
// statistics, and a rounding to the storage dtype exactly where the
// reference op sequence stores a tensor.
#include "kernels/common.cuh"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

// One block per row; each thread keeps up to kMaxPacks packs of the row
// in registers between the statistics and the scaling.
constexpr int kMaxPacks = 4;
// Packs each thread takes where the row is wide enough: a thread issues
// all of its loads before the block's reduction, so more packs per thread
// keep more bytes in flight: four packs per thread bring the norm close
// to memory bandwidth, fewer leave it short (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md).
#ifndef E3_NORM_PACKS_PER_THREAD
#define E3_NORM_PACKS_PER_THREAD 4
#endif
constexpr int kNormPacksPerThread = E3_NORM_PACKS_PER_THREAD;

template <typename T>
__global__ void __launch_bounds__(1024) AddRmsNormKernel(const T* __restrict__ residual, const T* __restrict__ delta,
                                 const T* __restrict__ weight, T* __restrict__ sum, T* __restrict__ out, int64_t cols,
                                 float inv_cols, float eps) {
  using P = Pack<T, kVec>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  const int packs = static_cast<int>(cols / kVec);
  const P* r = reinterpret_cast<const P*>(residual + base);
  const P* d = delta != nullptr ? reinterpret_cast<const P*>(delta + base) : nullptr;
  P h[kMaxPacks];
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPacks; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < packs) {
      P a = r[p];
      if (d != nullptr) {
        const P b = d[p];
#pragma unroll
        for (int i = 0; i < kVec; ++i) a.v[i] = Num<T>::FromF(Num<T>::ToF(a.v[i]) + Num<T>::ToF(b.v[i]));
        reinterpret_cast<P*>(sum + base)[p] = a;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float f = Num<T>::ToF(a.v[i]);
        sq += f * f;
      }
      h[k] = a;
    }
  }
  // mean() multiplies the sum by 1/n, as ATen's mean reduction does.
  const float inv_rms = rsqrtf(BlockSum(sq) * inv_cols + eps);
  const P* w = reinterpret_cast<const P*>(weight);
  P* o = reinterpret_cast<P*>(out + base);
#pragma unroll
  for (int k = 0; k < kMaxPacks; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < packs) {
      const P wk = w[p];
      P y;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float normed = RoundTo<T>(Num<T>::ToF(h[k].v[i]) * inv_rms);
        y.v[i] = Num<T>::FromF(Num<T>::ToF(wk.v[i]) * normed);
      }
      o[p] = y;
    }
  }
}

template <typename T>
void LaunchAddRmsNorm(const void* residual, const void* delta, const void* weight, void* sum, void* out, int64_t rows,
                      int64_t cols, float eps, int threads, cudaStream_t stream) {
  AddRmsNormKernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      static_cast<const T*>(residual), static_cast<const T*>(delta), static_cast<const T*>(weight),
      static_cast<T*>(sum), static_cast<T*>(out), cols, 1.f / static_cast<float>(cols), eps);
}

}  // namespace

bool AddRmsNorm(Dtype dtype, const void* residual, const void* delta, const void* weight, void* sum, void* out,
                int64_t rows, int64_t cols, float eps, void* stream) {
  if (rows <= 0 || rows > 0x7fffffff || cols % kVec != 0) return false;
  if (!Aligned16OrNull(residual) || !Aligned16OrNull(delta) || !Aligned16OrNull(weight) || !Aligned16OrNull(sum) ||
      !Aligned16OrNull(out)) {
    return false;
  }
  const int64_t packs = cols / kVec;
  int64_t threads = ((packs + kNormPacksPerThread - 1) / kNormPacksPerThread + 31) / 32 * 32;
  if (threads > 1024) threads = 1024;
  if (packs > threads * kMaxPacks) return false;
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == Dtype::kBFloat16) {
    LaunchAddRmsNorm<__nv_bfloat16>(residual, delta, weight, sum, out, rows, cols, eps, static_cast<int>(threads), s);
  } else {
    LaunchAddRmsNorm<__half>(residual, delta, weight, sum, out, rows, cols, eps, static_cast<int>(threads), s);
  }
  return true;
}

}  // namespace e3::kernels
