// SiLU-mul over a fused gate/up projection, forward and backward (see
// student_kernels.h): one 16-byte pack of gate and one of up per thread
// and grid-stride step.
#include "student_trainer/kernels/kernel_common.cuh"

namespace e3::student_kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

template <typename T>
__global__ void SiluMulForwardKernel(const T* __restrict__ gate_up, T* __restrict__ out,
                                     int64_t rows, int64_t packs_per_row) {
  using P = Pack<T, kVec>;
  const int64_t total = rows * packs_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / packs_per_row, p = i % packs_per_row;
    const P* row = reinterpret_cast<const P*>(gate_up) + r * 2 * packs_per_row;
    const P g = row[p];
    const P u = row[packs_per_row + p];
    P o;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float gf = Num<T>::ToF(g.v[e]);
      const float silu = RoundTo<T>(gf * Sigmoid(gf));
      o.v[e] = Num<T>::FromF(silu * Num<T>::ToF(u.v[e]));
    }
    reinterpret_cast<P*>(out)[i] = o;
  }
}

template <typename T>
__global__ void SiluMulBackwardKernel(const T* __restrict__ dout, const T* __restrict__ gate_up,
                                      T* __restrict__ d_gate_up, int64_t rows,
                                      int64_t packs_per_row) {
  using P = Pack<T, kVec>;
  const int64_t total = rows * packs_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / packs_per_row, p = i % packs_per_row;
    const P* row = reinterpret_cast<const P*>(gate_up) + r * 2 * packs_per_row;
    P* drow = reinterpret_cast<P*>(d_gate_up) + r * 2 * packs_per_row;
    const P g = row[p];
    const P u = row[packs_per_row + p];
    const P d = reinterpret_cast<const P*>(dout)[i];
    P dg, du;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float gf = Num<T>::ToF(g.v[e]);
      const float df = Num<T>::ToF(d.v[e]);
      const float s = Sigmoid(gf);
      const float silu = gf * s;
      dg.v[e] = Num<T>::FromF(df * Num<T>::ToF(u.v[e]) * s * (1.f + gf * (1.f - s)));
      du.v[e] = Num<T>::FromF(df * RoundTo<T>(silu));
    }
    drow[p] = dg;
    drow[packs_per_row + p] = du;
  }
}

bool Takes(int64_t rows, int64_t cols, const void* a, const void* b, const void* c) {
  return rows > 0 && cols > 0 && cols % kVec == 0 && Aligned16(a) && Aligned16(b) &&
         (c == nullptr || Aligned16(c));
}

}  // namespace

bool SiluMulForward(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t cols,
                    void* stream) {
  if (!Takes(rows, cols, gate_up, out, nullptr)) return false;
  const int64_t packs = cols / kVec;
  const int64_t blocks = GridBlocks(rows * packs, kThreads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    SiluMulForwardKernel<T><<<blocks, kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(gate_up), static_cast<T*>(out), rows, packs);
    return true;
  });
}

bool SiluMulBackward(Dtype dtype, const void* dout, const void* gate_up, void* d_gate_up,
                     int64_t rows, int64_t cols, void* stream) {
  if (!Takes(rows, cols, dout, gate_up, d_gate_up)) return false;
  const int64_t packs = cols / kVec;
  const int64_t blocks = GridBlocks(rows * packs, kThreads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    SiluMulBackwardKernel<T><<<blocks, kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(dout), static_cast<const T*>(gate_up), static_cast<T*>(d_gate_up),
        rows, packs);
    return true;
  });
}

}  // namespace e3::student_kernels
