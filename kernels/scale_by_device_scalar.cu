// Multiplies a 16-bit tensor in place by an fp32 scalar that lives on the
// device (an autograd output gradient), or adds it so multiplied to
// another: ATen broadcasts a 0-dim CUDA tensor with stride 0, which takes
// its unvectorised path, well short of the memory's bandwidth; one
// 16-byte pack per thread and grid-stride step here.
#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void ScaleKernel(T* __restrict__ x, int64_t packs, const float* __restrict__ scale) {
  using P = Pack<T, kVec>;
  const float s = *scale;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    P p = reinterpret_cast<P*>(x)[i];
#pragma unroll
    for (int e = 0; e < kVec; ++e) p.v[e] = Num<T>::FromF(Num<T>::ToF(p.v[e]) * s);
    reinterpret_cast<P*>(x)[i] = p;
  }
}

template <typename T>
__global__ void AddScaledKernel(T* __restrict__ y, const T* __restrict__ x, int64_t packs,
                                const float* __restrict__ scale) {
  using P = Pack<T, kVec>;
  const float s = *scale;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    P out = reinterpret_cast<P*>(y)[i];
    const P in = reinterpret_cast<const P*>(x)[i];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      out.v[e] = Num<T>::FromF(fmaf(Num<T>::ToF(in.v[e]), s, Num<T>::ToF(out.v[e])));
    }
    reinterpret_cast<P*>(y)[i] = out;
  }
}

}  // namespace

bool AddScaledByDeviceScalar(Dtype dtype, void* y, const void* x, int64_t n, const float* scale,
                             void* stream) {
  if (n <= 0 || n % kVec != 0 || !Aligned16(y) || !Aligned16(x)) return false;
  const int64_t packs = n / kVec;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    AddScaledKernel<T><<<GridBlocks(packs, kThreads), kThreads, 0, AsStream(stream)>>>(
        static_cast<T*>(y), static_cast<const T*>(x), packs, scale);
    return true;
  });
}

bool ScaleByDeviceScalar(Dtype dtype, void* x, int64_t n, const float* scale, void* stream) {
  if (n <= 0 || n % kVec != 0 || !Aligned16(x)) return false;
  const int64_t packs = n / kVec;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    ScaleKernel<T><<<GridBlocks(packs, kThreads), kThreads, 0, AsStream(stream)>>>(
        static_cast<T*>(x), packs, scale);
    return true;
  });
}

}  // namespace e3::kernels
