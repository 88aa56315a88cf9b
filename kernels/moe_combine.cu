// The routed-experts sum of a MoE layer for the teacher (see
// teacher_ops.h, MoeCombine): one 16-byte pack of one token per thread and
// grid-stride step, rounded after every product and add.
#include "kernels/common.cuh"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loops' grid

// A router weight as a float: a 16-bit one widened, an fp32 one as it is.
template <typename T>
__device__ __forceinline__ float WeightToF(T w) {
  return Num<T>::ToF(w);
}
template <>
__device__ __forceinline__ float WeightToF<float>(float w) {
  return w;
}

// One pack of 8 features of one token per thread: the token's k weighted
// expert outputs added in slot order, rounded after every product and add.
// W: the weights' type (T, or float for DeepSeekMoE's fp32 weights).
template <typename T, typename W>
__global__ void MoeCombineKernel(const T* __restrict__ y, const int64_t* __restrict__ rows,
                                 const W* __restrict__ weights, const uint8_t* __restrict__ valid, T* __restrict__ out,
                                 int64_t tokens, int64_t k, int64_t cols) {
  using P = Pack<T, kVec>;
  const int64_t packs = cols / kVec;
  const int64_t total = tokens * packs;
  for (int64_t idx = GridStrideStart(); idx < total; idx += GridStride()) {
    const int64_t t = idx / packs, p = idx % packs;
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
    for (int64_t r = 0; r < k; ++r) {
      const int64_t slot = t * k + r;
      if (valid != nullptr && valid[slot] == 0) continue;
      const P v = reinterpret_cast<const P*>(y + rows[slot] * cols)[p];
      const float w = WeightToF(weights[slot]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = RoundTo<T>(acc[i] + RoundTo<T>(Num<T>::ToF(v.v[i]) * w));
    }
    P o;
#pragma unroll
    for (int i = 0; i < kVec; ++i) o.v[i] = Num<T>::FromF(acc[i]);
    reinterpret_cast<P*>(out + t * cols)[p] = o;
  }
}

}  // namespace

bool MoeCombine(Dtype dtype, const void* y, const int64_t* rows, const void* weights, bool fp32_weights,
                const uint8_t* valid, void* out, int64_t tokens, int64_t k, int64_t cols, void* stream) {
  if (tokens <= 0 || k <= 0 || cols % kVec != 0 || !Aligned16OrNull(y) || !Aligned16OrNull(out)) return false;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = GridBlocks(tokens * cols / kVec, kThreads, kMaxBlocks);
  if (dtype == Dtype::kBFloat16) {
    using T = __nv_bfloat16;
    if (fp32_weights) {
      MoeCombineKernel<T, float><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                             static_cast<const float*>(weights), valid,
                                                             static_cast<T*>(out), tokens, k, cols);
    } else {
      MoeCombineKernel<T, T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                         static_cast<const T*>(weights), valid, static_cast<T*>(out),
                                                         tokens, k, cols);
    }
  } else {
    using T = __half;
    if (fp32_weights) {
      MoeCombineKernel<T, float><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                             static_cast<const float*>(weights), valid,
                                                             static_cast<T*>(out), tokens, k, cols);
    } else {
      MoeCombineKernel<T, T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                         static_cast<const T*>(weights), valid, static_cast<T*>(out),
                                                         tokens, k, cols);
    }
  }
  return true;
}

}  // namespace e3::kernels
