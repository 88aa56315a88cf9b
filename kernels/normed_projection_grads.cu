// The weight gradients of a projection of RMSNorm'd rows whose input takes
// no gradient (see student_ops.h): one pass over the [rows, cols]
// weight matrix. A warp covers 256 consecutive columns (a 16-byte pack of
// the weight a lane), the block's 8 warps take every 8th row of its row
// block, and the norm weight's partial sums meet in shared memory once.
#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kLanes = 32;                // packs of columns per block
constexpr int kRowLanes = 8;              // warps per block, one row each
constexpr int kThreads = kLanes * kRowLanes;
constexpr int kColsPerBlock = kLanes * kVec;
constexpr int64_t kRowsPerBlock = 64;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    NormedProjectionGradsKernel(const float* __restrict__ g, const T* __restrict__ norm_weight,
                                const T* __restrict__ weight, T* __restrict__ weight_grad, int64_t ld,
                                float* __restrict__ dw_partial, int64_t rows, int64_t cols) {
  using P = Pack<T, kVec>;
  const int lane = threadIdx.x % kLanes, row_lane = threadIdx.x / kLanes;
  const int64_t pack = static_cast<int64_t>(blockIdx.x) * kLanes + lane;
  float sums[kVec] = {};
  if (pack < cols / kVec) {
    const P wp = reinterpret_cast<const P*>(norm_weight)[pack];
    float w[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) w[e] = Num<T>::ToF(wp.v[e]);
    const int64_t first = blockIdx.y * kRowsPerBlock;
    const int64_t end = first + kRowsPerBlock < rows ? first + kRowsPerBlock : rows;
    for (int64_t r = first + row_lane; r < end; r += kRowLanes) {
      const float4* gr = reinterpret_cast<const float4*>(g + r * cols) + 2 * pack;
      const float4 a = gr[0], b = gr[1];
      const float gv[kVec] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      const P wr = reinterpret_cast<const P*>(weight + r * ld)[pack];
      P* dst = reinterpret_cast<P*>(weight_grad + r * ld) + pack;
      P d = *dst;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        sums[e] += Num<T>::ToF(wr.v[e]) * gv[e];
        d.v[e] = Num<T>::FromF(fmaf(gv[e], w[e], Num<T>::ToF(d.v[e])));
      }
      *dst = d;
    }
  }
  __shared__ float partial[kRowLanes][kColsPerBlock];
#pragma unroll
  for (int e = 0; e < kVec; ++e) partial[row_lane][lane * kVec + e] = sums[e];
  __syncthreads();
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColsPerBlock + threadIdx.x;
  if (col < cols) {
    float s = 0.f;
#pragma unroll
    for (int l = 0; l < kRowLanes; ++l) s += partial[l][threadIdx.x];
    dw_partial[blockIdx.y * cols + col] = s;
  }
}

}  // namespace

int64_t NormedProjectionGradBlocks(int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

bool NormedProjectionGrads(Dtype dtype, const float* g, const void* norm_weight, const void* weight,
                           void* weight_grad, int64_t ld, float* dw_partial, int64_t rows, int64_t cols,
                           void* stream) {
  if (rows <= 0 || cols <= 0 || cols % kVec != 0 || ld % kVec != 0 || ld < cols || !Aligned16(g) ||
      !Aligned16(norm_weight) || !Aligned16(weight) || !Aligned16(weight_grad) ||
      NormedProjectionGradBlocks(rows) > 65535) {
    return false;
  }
  const dim3 grid(static_cast<unsigned>((cols + kColsPerBlock - 1) / kColsPerBlock),
                  static_cast<unsigned>(NormedProjectionGradBlocks(rows)));
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    NormedProjectionGradsKernel<T><<<grid, kThreads, 0, AsStream(stream)>>>(
        g, static_cast<const T*>(norm_weight), static_cast<const T*>(weight), static_cast<T*>(weight_grad), ld,
        dw_partial, rows, cols);
    return true;
  });
}

}  // namespace e3::kernels
