// GPT-OSS's clamped SwiGLU expert activation for the teacher (see
// teacher_ops.h, ClampedSwiGlu): one 16-byte pack per thread and
// grid-stride step, rounded where the ATen op sequence stores a tensor.
#include "kernels/common.cuh"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loops' grid

// One pack of 8 activations per thread: GPT-OSS's clamped SwiGLU of one
// row of a grouped gate_up product (gate packs, then up packs), its
// expert's gate/up bias added first, each step rounded where the ATen
// sequence stores a tensor (ClampedSwiGluActivation): the bias adds; the
// clamps (exact; NaN passes, as ATen's clamp); g * alpha; sigmoid as ATen
// computes it, 1 / (1 + exp(-x)) in fp32; g * sigmoid; up + 1; the product.
template <typename T>
__global__ void ClampedSwiGluKernel(const T* __restrict__ gate_up, const T* __restrict__ bias,
                                    const int64_t* __restrict__ row_expert, T* __restrict__ out, int64_t rows,
                                    int64_t cols, float alpha, float limit, const int32_t* __restrict__ row_limit) {
  using P = Pack<T, kVec>;
  const int64_t packs = cols / kVec;
  const int64_t total = LimitedRows(rows, row_limit) * packs;
  const P* in = reinterpret_cast<const P*>(gate_up);
  const P* b = reinterpret_cast<const P*>(bias);
  P* o = reinterpret_cast<P*>(out);
  const float lim = RoundTo<T>(limit);  // ATen's clamp converts its bound to the dtype
  for (int64_t idx = GridStrideStart(); idx < total; idx += GridStride()) {
    const int64_t row = idx / packs, p = idx - row * packs;
    const P g = in[row * 2 * packs + p];
    const P u = in[row * 2 * packs + packs + p];
    P bg, bu;
    if (b != nullptr) {
      const int64_t e = row_expert[row];
      bg = b[e * 2 * packs + p];
      bu = b[e * 2 * packs + packs + p];
    }
    P y;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float gv = Num<T>::ToF(g.v[i]), uv = Num<T>::ToF(u.v[i]);
      if (b != nullptr) {
        gv = RoundTo<T>(gv + Num<T>::ToF(bg.v[i]));
        uv = RoundTo<T>(uv + Num<T>::ToF(bu.v[i]));
      }
      if (!isnan(gv)) gv = fminf(gv, lim);
      if (!isnan(uv)) uv = fminf(fmaxf(uv, -lim), lim);
      const float scaled = RoundTo<T>(gv * alpha);
      const float sig = RoundTo<T>(1.f / (1.f + expf(-scaled)));
      const float glu = RoundTo<T>(gv * sig);
      const float up1 = RoundTo<T>(uv + 1.f);
      y.v[i] = Num<T>::FromF(up1 * glu);
    }
    o[idx] = y;
  }
}

}  // namespace

bool ClampedSwiGlu(Dtype dtype, const void* gate_up, const void* bias, const int64_t* row_expert, void* out,
                   int64_t rows, int64_t cols, float alpha, float limit, const int32_t* row_limit, void* stream) {
  if (rows <= 0 || cols % kVec != 0 || !Aligned16OrNull(gate_up) || !Aligned16OrNull(bias) || !Aligned16OrNull(out) ||
      (bias == nullptr) != (row_expert == nullptr)) {
    return false;
  }
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = GridBlocks(rows * cols / kVec, kThreads, kMaxBlocks);
  if (dtype == Dtype::kBFloat16) {
    using T = __nv_bfloat16;
    ClampedSwiGluKernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(gate_up), static_cast<const T*>(bias),
                                                       row_expert, static_cast<T*>(out), rows, cols, alpha, limit,
                                                       row_limit);
  } else {
    using T = __half;
    ClampedSwiGluKernel<T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(gate_up), static_cast<const T*>(bias),
                                                       row_expert, static_cast<T*>(out), rows, cols, alpha, limit,
                                                       row_limit);
  }
  return true;
}

}  // namespace e3::kernels
