// The lm_head's target argmax over stored logits (see teacher_ops.h,
// RowArgmax): one block per row, at::argmax's order (argmax_key.h).
#include "kernels/argmax_key.h"
#include "kernels/common.cuh"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

// The warp's best (value, index) pair in at::argmax's order (ArgmaxPrefers,
// argmax_key.h: a total order, so any reduction tree gives at::argmax's
// answer), left in every lane.
__device__ __forceinline__ void WarpArgBest(float& best, int32_t& best_i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ArgmaxPrefers(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
}

constexpr int kArgmaxThreads = 512;

// One block per row; each thread scans a strided share of the row, four
// 16-byte loads in flight, then the block reduces (value, index) pairs.
template <typename T, bool kVectorised>
__global__ void __launch_bounds__(kArgmaxThreads)
    RowArgmaxKernel(const T* __restrict__ x, int64_t cols, int64_t row_stride, int32_t* __restrict__ out) {
  const T* row = x + static_cast<int64_t>(blockIdx.x) * row_stride;
  float best = -INFINITY;
  int32_t best_i = 0x7fffffff;
  auto consider = [&](float v, int64_t i) {
    if (ArgmaxPrefers(v, static_cast<int32_t>(i), best, best_i)) {
      best = v;
      best_i = static_cast<int32_t>(i);
    }
  };
  if (kVectorised) {
    using P = Pack<T, kVec>;
    constexpr int kUnroll = 4;
    const P* packs = reinterpret_cast<const P*>(row);
    const int64_t n = cols / kVec, stride = blockDim.x;
    int64_t p = threadIdx.x;
    for (; p + (kUnroll - 1) * stride < n; p += kUnroll * stride) {
      P v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = packs[p + u * stride];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) consider(Num<T>::ToF(v[u].v[i]), (p + u * stride) * kVec + i);
      }
    }
    for (; p < n; p += stride) {
      const P v = packs[p];
#pragma unroll
      for (int i = 0; i < kVec; ++i) consider(Num<T>::ToF(v.v[i]), p * kVec + i);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) consider(Num<T>::ToF(row[c]), c);
  }
  WarpArgBest(best, best_i);
  __shared__ float warp_best[32];
  __shared__ int32_t warp_index[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_index[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x >> 5);
    best = lane < warps ? warp_best[lane] : -INFINITY;
    best_i = lane < warps ? warp_index[lane] : 0x7fffffff;
    WarpArgBest(best, best_i);
    if (lane == 0) out[blockIdx.x] = best_i;
  }
}

template <typename T>
void LaunchRowArgmax(const void* x, int64_t rows, int64_t cols, int64_t row_stride, int32_t* out, bool vectorised,
                     cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const auto blocks = static_cast<unsigned>(rows);
  if (vectorised) {
    RowArgmaxKernel<T, true><<<blocks, kArgmaxThreads, 0, stream>>>(xt, cols, row_stride, out);
  } else {
    RowArgmaxKernel<T, false><<<blocks, kArgmaxThreads, 0, stream>>>(xt, cols, row_stride, out);
  }
}

}  // namespace

bool RowArgmax(Dtype dtype, const void* x, int64_t rows, int64_t cols, int64_t row_stride, int32_t* out,
               void* stream) {
  if (rows <= 0 || rows > 0x7fffffff || cols <= 0 || cols > 0x7fffffff || row_stride < cols) return false;
  const bool vectorised = cols % kVec == 0 && row_stride % kVec == 0 && Aligned16OrNull(x);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == Dtype::kBFloat16) {
    LaunchRowArgmax<__nv_bfloat16>(x, rows, cols, row_stride, out, vectorised, s);
  } else {
    LaunchRowArgmax<__half>(x, rows, cols, row_stride, out, vectorised, s);
  }
  return true;
}

}  // namespace e3::kernels
