// RMSNorm forward and backward for the student (see student_ops.h).
// One block per row in the forward; the backward walks rows with a
// bounded grid so that each block keeps its weight-gradient partial sums
// in registers and writes them once.
#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

// The forward holds a row's packs in registers; the backward holds them
// twice (x and dy * w) beside the weight and its gradient partials, so it
// spreads a row over more threads.
constexpr int kForwardThreads = 256;
constexpr int kBackwardThreads = 512;
constexpr int kMaxBackwardBlocks = 512;

// Threads per block and packs per thread for a row of `packs` packs.
struct RowSplit {
  int threads = 0;
  int packs_per_thread = 0;
};

RowSplit SplitRow(int64_t packs, int max_threads) {
  RowSplit s;
  s.threads = packs >= max_threads ? max_threads : static_cast<int>((packs + 31) / 32 * 32);
  const int64_t per = (packs + s.threads - 1) / s.threads;
  s.packs_per_thread = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : per <= 8 ? 8 : 0;
  return s;
}

template <typename T, int kPacks>
__global__ void __launch_bounds__(kForwardThreads)
    RmsNormForwardKernel(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ weight,
                         T* __restrict__ y, int64_t y_stride, float* __restrict__ rstd, int packs,
                         float inv_cols, float eps) {
  using P = Pack<T, kVec>;
  const int64_t row = blockIdx.x;
  const P* xr = reinterpret_cast<const P*>(x + row * x_stride);
  P* yr = reinterpret_cast<P*>(y + row * y_stride);
  const P* w = reinterpret_cast<const P*>(weight);
  P h[kPacks];
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < packs) {
      h[k] = xr[i];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float f = Num<T>::ToF(h[k].v[e]);
        sq += f * f;
      }
    }
  }
  const float inv = rsqrtf(BlockSum(sq) * inv_cols + eps);
  if (threadIdx.x == 0) rstd[row] = inv;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < packs) {
      const P wv = w[i];
      P out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float n = RoundTo<T>(Num<T>::ToF(h[k].v[e]) * inv);
        out.v[e] = Num<T>::FromF(Num<T>::ToF(wv.v[e]) * n);
      }
      yr[i] = out;
    }
  }
}

template <typename T, int kPacks>
__global__ void __launch_bounds__(kBackwardThreads)
    RmsNormBackwardKernel(const T* __restrict__ dy, const T* __restrict__ x, int64_t x_stride,
                          const T* __restrict__ weight, const float* __restrict__ rstd,
                          const T* dresidual, T* dx, float* __restrict__ dw_partial, int64_t rows,
                          int packs, float inv_cols) {
  using P = Pack<T, kVec>;
  const P* w = reinterpret_cast<const P*>(weight);
  float wf[kPacks][kVec];
  float dw[kPacks][kVec];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      wf[k][e] = 0.f;
      dw[k][e] = 0.f;
    }
    if (i < packs) {
      const P wv = w[i];
#pragma unroll
      for (int e = 0; e < kVec; ++e) wf[k][e] = Num<T>::ToF(wv.v[e]);
    }
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + row * x_stride);
    const P* dyr = reinterpret_cast<const P*>(dy + row * static_cast<int64_t>(packs) * kVec);
    P* dxr = reinterpret_cast<P*>(dx + row * static_cast<int64_t>(packs) * kVec);
    const P* drr = dresidual == nullptr
                       ? nullptr
                       : reinterpret_cast<const P*>(dresidual + row * static_cast<int64_t>(packs) * kVec);
    const float r = rstd[row];
    float xf[kPacks][kVec], g[kPacks][kVec];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < packs) {
        const P xv = xr[i];
        const P dv = dyr[i];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          xf[k][e] = Num<T>::ToF(xv.v[e]);
          const float d = Num<T>::ToF(dv.v[e]);
          g[k][e] = d * wf[k][e];
          dot += g[k][e] * xf[k][e];
          dw[k][e] += d * RoundTo<T>(xf[k][e] * r);
        }
      }
    }
    const float c = BlockSum(dot) * inv_cols * r * r * r;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < packs) {
        float d[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) d[e] = r * g[k][e] - c * xf[k][e];
        if (drr != nullptr) {
          const P rv = drr[i];
#pragma unroll
          for (int e = 0; e < kVec; ++e) d[e] += Num<T>::ToF(rv.v[e]);
        }
        P out;
#pragma unroll
        for (int e = 0; e < kVec; ++e) out.v[e] = Num<T>::FromF(d[e]);
        dxr[i] = out;
      }
    }
  }
  float* part = dw_partial + static_cast<int64_t>(blockIdx.x) * packs * kVec;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < packs) {
      float4* out = reinterpret_cast<float4*>(part + static_cast<int64_t>(i) * kVec);
      out[0] = make_float4(dw[k][0], dw[k][1], dw[k][2], dw[k][3]);
      out[1] = make_float4(dw[k][4], dw[k][5], dw[k][6], dw[k][7]);
    }
  }
}

bool RowsTakeVectors(const void* a, int64_t a_stride, int64_t cols) {
  return cols > 0 && cols % kVec == 0 && Aligned16(a) && a_stride % kVec == 0;
}

}  // namespace

bool RmsNormForward(Dtype dtype, const void* x, int64_t x_stride, const void* weight, void* y,
                    int64_t y_stride, float* rstd, int64_t rows, int64_t cols, float eps,
                    void* stream) {
  if (rows <= 0 || !RowsTakeVectors(x, x_stride, cols) || !RowsTakeVectors(y, y_stride, cols) ||
      !Aligned16(weight) || rows > 0x7fffffff) {
    return false;
  }
  const RowSplit s = SplitRow(cols / kVec, kForwardThreads);
  if (s.packs_per_thread == 0) return false;
  const int packs = static_cast<int>(cols / kVec);
  const float inv_cols = 1.f / static_cast<float>(cols);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(weight);
    T* yt = static_cast<T*>(y);
    const dim3 grid(static_cast<unsigned>(rows));
    switch (s.packs_per_thread) {
      case 1:
        RmsNormForwardKernel<T, 1><<<grid, s.threads, 0, AsStream(stream)>>>(
            xt, x_stride, wt, yt, y_stride, rstd, packs, inv_cols, eps);
        break;
      case 2:
        RmsNormForwardKernel<T, 2><<<grid, s.threads, 0, AsStream(stream)>>>(
            xt, x_stride, wt, yt, y_stride, rstd, packs, inv_cols, eps);
        break;
      case 4:
        RmsNormForwardKernel<T, 4><<<grid, s.threads, 0, AsStream(stream)>>>(
            xt, x_stride, wt, yt, y_stride, rstd, packs, inv_cols, eps);
        break;
      default:
        RmsNormForwardKernel<T, 8><<<grid, s.threads, 0, AsStream(stream)>>>(
            xt, x_stride, wt, yt, y_stride, rstd, packs, inv_cols, eps);
        break;
    }
    return true;
  });
}

int64_t RmsNormBackwardBlocks(int64_t rows) {
  return rows < kMaxBackwardBlocks ? (rows < 1 ? 1 : rows) : kMaxBackwardBlocks;
}

bool RmsNormBackward(Dtype dtype, const void* dy, const void* x, int64_t x_stride,
                     const void* weight, const float* rstd, const void* dresidual, void* dx,
                     float* dw_partial, int64_t rows, int64_t cols, void* stream) {
  if (rows <= 0 || !RowsTakeVectors(x, x_stride, cols) || !RowsTakeVectors(dy, cols, cols) ||
      !RowsTakeVectors(dx, cols, cols) || !Aligned16(weight) || !Aligned16(dw_partial) ||
      (dresidual != nullptr && !RowsTakeVectors(dresidual, cols, cols))) {
    return false;
  }
  const RowSplit s = SplitRow(cols / kVec, kBackwardThreads);
  if (s.packs_per_thread == 0) return false;
  const int packs = static_cast<int>(cols / kVec);
  const float inv_cols = 1.f / static_cast<float>(cols);
  const dim3 grid(static_cast<unsigned>(RmsNormBackwardBlocks(rows)));
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* dyt = static_cast<const T*>(dy);
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(weight);
    const T* drt = static_cast<const T*>(dresidual);
    T* dxt = static_cast<T*>(dx);
    switch (s.packs_per_thread) {
      case 1:
        RmsNormBackwardKernel<T, 1><<<grid, s.threads, 0, AsStream(stream)>>>(
            dyt, xt, x_stride, wt, rstd, drt, dxt, dw_partial, rows, packs, inv_cols);
        break;
      case 2:
        RmsNormBackwardKernel<T, 2><<<grid, s.threads, 0, AsStream(stream)>>>(
            dyt, xt, x_stride, wt, rstd, drt, dxt, dw_partial, rows, packs, inv_cols);
        break;
      case 4:
        RmsNormBackwardKernel<T, 4><<<grid, s.threads, 0, AsStream(stream)>>>(
            dyt, xt, x_stride, wt, rstd, drt, dxt, dw_partial, rows, packs, inv_cols);
        break;
      default:
        RmsNormBackwardKernel<T, 8><<<grid, s.threads, 0, AsStream(stream)>>>(
            dyt, xt, x_stride, wt, rstd, drt, dxt, dw_partial, rows, packs, inv_cols);
        break;
    }
    return true;
  });
}

}  // namespace e3::kernels
