// Rotary embedding in place for the teacher (see teacher_ops.h,
// RopeInPlace): 16-byte accesses where the shape allows, fp32 arithmetic,
// and a rounding to the storage dtype exactly where the reference op
// sequence stores a tensor.
#include "kernels/common.cuh"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loops' grid

// Thread work: N consecutive features i of the first half and the N
// features i + half they rotate with. Index is 32-bit where every offset
// fits (FitsUint32); unlike SiLU-mul's kernel this one asks for no minimum
// of resident blocks: rope capped at 32 registers spills.
template <typename T, int N, typename Index>
__global__ void RopeKernel(T* __restrict__ x, Index tokens, Index heads, Index row_stride, Index head_stride,
                           Index rotary_dim, const T* __restrict__ cos, const T* __restrict__ sin) {
  using P = Pack<T, N>;
  const Index half = rotary_dim / 2, groups = half / N;
  const Index total = tokens * heads * groups;
  for (Index idx = GridStrideStart<Index>(); idx < total; idx += GridStride<Index>()) {
    const Index th = idx / groups, g = idx - th * groups;
    const Index t = th / heads, h = th - t * heads;
    const Index i = g * N;
    T* p = x + t * row_stride + h * head_stride;
    const T* c = cos + t * rotary_dim;
    const T* s = sin + t * rotary_dim;
    P x1 = *reinterpret_cast<const P*>(p + i), x2 = *reinterpret_cast<const P*>(p + i + half);
    const P c1 = *reinterpret_cast<const P*>(c + i), c2 = *reinterpret_cast<const P*>(c + i + half);
    const P s1 = *reinterpret_cast<const P*>(s + i), s2 = *reinterpret_cast<const P*>(s + i + half);
    P y1, y2;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float a = Num<T>::ToF(x1.v[k]), b = Num<T>::ToF(x2.v[k]);
      // rotate_half(x) = cat(-x2, x1): each product is a stored tensor.
      y1.v[k] = Num<T>::FromF(RoundTo<T>(a * Num<T>::ToF(c1.v[k])) + RoundTo<T>(-b * Num<T>::ToF(s1.v[k])));
      y2.v[k] = Num<T>::FromF(RoundTo<T>(b * Num<T>::ToF(c2.v[k])) + RoundTo<T>(a * Num<T>::ToF(s2.v[k])));
    }
    *reinterpret_cast<P*>(p + i) = y1;
    *reinterpret_cast<P*>(p + i + half) = y2;
  }
}

template <typename T, typename Index>
void LaunchRope(void* x, int64_t tokens, int64_t heads, int64_t row_stride, int64_t head_stride, int64_t rotary_dim,
                const void* cos, const void* sin, bool vectorised, cudaStream_t stream) {
  T* xt = static_cast<T*>(x);
  const T* c = static_cast<const T*>(cos);
  const T* s = static_cast<const T*>(sin);
  const int64_t half = rotary_dim / 2;
  const auto n = [](int64_t v) { return static_cast<Index>(v); };
  if (vectorised) {
    RopeKernel<T, kVec, Index><<<GridBlocks(tokens * heads * half / kVec, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        xt, n(tokens), n(heads), n(row_stride), n(head_stride), n(rotary_dim), c, s);
  } else {
    RopeKernel<T, 1, Index><<<GridBlocks(tokens * heads * half, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        xt, n(tokens), n(heads), n(row_stride), n(head_stride), n(rotary_dim), c, s);
  }
}

template <typename T>
void LaunchRope(void* x, int64_t tokens, int64_t heads, int64_t row_stride, int64_t head_stride, int64_t rotary_dim,
                const void* cos, const void* sin, bool vectorised, cudaStream_t stream) {
  // Past the largest offset read or written (the last token's last head's
  // rotated features, and its row of cos/sin).
  const bool narrow =
      FitsUint32(tokens * row_stride + heads * head_stride + rotary_dim) && FitsUint32(tokens * rotary_dim);
  if (narrow) {
    LaunchRope<T, uint32_t>(x, tokens, heads, row_stride, head_stride, rotary_dim, cos, sin, vectorised, stream);
  } else {
    LaunchRope<T, int64_t>(x, tokens, heads, row_stride, head_stride, rotary_dim, cos, sin, vectorised, stream);
  }
}

}  // namespace

bool RopeInPlace(Dtype dtype, void* x, int64_t tokens, int64_t heads, int64_t row_stride, int64_t head_stride,
                 int64_t rotary_dim, const void* cos, const void* sin, void* stream) {
  if (tokens <= 0 || heads <= 0 || rotary_dim <= 0 || rotary_dim % 2 != 0) return false;
  const int64_t half = rotary_dim / 2;
  const bool vectorised = half % kVec == 0 && row_stride % kVec == 0 && head_stride % kVec == 0 &&
                          Aligned16OrNull(x) && Aligned16OrNull(cos) && Aligned16OrNull(sin);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == Dtype::kBFloat16) {
    LaunchRope<__nv_bfloat16>(x, tokens, heads, row_stride, head_stride, rotary_dim, cos, sin, vectorised, s);
  } else {
    LaunchRope<__half>(x, tokens, heads, row_stride, head_stride, rotary_dim, cos, sin, vectorised, s);
  }
  return true;
}

}  // namespace e3::kernels
