// Adds the rows of a 16-bit gradient into distinct rows of an fp32 sum by
// index (see student_ops.h): one 16-byte pack per thread and
// grid-stride step, a plain read-modify-write of two float4s (fp32 atomics
// here reach only a fraction of the bandwidth; bench/results/2026-12-07-rejected-experiments.md).
#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void ScatterAddRowsKernel(const T* __restrict__ src, const int64_t* __restrict__ rows,
                                     float* __restrict__ sum, int64_t n, int64_t packs_per_row) {
  using P = Pack<T, kVec>;
  const int64_t total = n * packs_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / packs_per_row, p = i % packs_per_row;
    const P x = reinterpret_cast<const P*>(src)[i];
    float4* out = reinterpret_cast<float4*>(sum + (rows[r] * packs_per_row + p) * kVec);
    float4 a = out[0], b = out[1];
    a.x += Num<T>::ToF(x.v[0]);
    a.y += Num<T>::ToF(x.v[1]);
    a.z += Num<T>::ToF(x.v[2]);
    a.w += Num<T>::ToF(x.v[3]);
    b.x += Num<T>::ToF(x.v[4]);
    b.y += Num<T>::ToF(x.v[5]);
    b.z += Num<T>::ToF(x.v[6]);
    b.w += Num<T>::ToF(x.v[7]);
    out[0] = a;
    out[1] = b;
  }
}

}  // namespace

bool ScatterAddRows(Dtype dtype, const void* src, const int64_t* rows, float* sum, int64_t n,
                    int64_t cols, void* stream) {
  if (n <= 0 || cols <= 0 || cols % kVec != 0 || !Aligned16(src) || !Aligned16(sum)) return false;
  const int64_t packs = cols / kVec;
  const int64_t blocks = GridBlocks(n * packs, kThreads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ScatterAddRowsKernel<T><<<blocks, kThreads, 0, AsStream(stream)>>>(static_cast<const T*>(src), rows, sum,
                                                                       n, packs);
    return true;
  });
}

}  // namespace e3::kernels
