// Qwen3's per-head q/k RMSNorm followed by rope, in place, for the teacher
// (see teacher_ops.h, HeadRmsNormRopeInPlace): one read and one write of
// each head, with AddRmsNorm's and RopeInPlace's roundings.
#include "kernels/common.cuh"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;

// Qwen3's per-head q/k norm and rope in one pass. A group of L lanes
// (head_dim / 8, a power of two up to 32, so a group stays inside one
// warp) takes one head: a 16-byte pack per lane, the squares summed by
// shuffles within the group, the normalised pack rounded as AddRmsNorm
// rounds it, then each lane of the rotary prefix fetches its rotation
// partner's normalised pack (half a prefix away) and rotates as RopeKernel.
// Every lane of a warp reaches every shuffle: lanes past the last head
// carry zeros and store nothing.
template <typename T, int L>
__global__ void HeadNormRopeKernel(T* __restrict__ x, int64_t heads_total, int64_t heads, int64_t row_stride,
                                   int64_t head_stride, const T* __restrict__ weight, float inv_dim, float eps,
                                   int rotary_dim, const T* __restrict__ cos, const T* __restrict__ sin) {
  using P = Pack<T, kVec>;
  static_assert(L >= 1 && L <= 32 && (L & (L - 1)) == 0, "a head's lanes must tile a warp");
  constexpr int kHeadsPerBlock = kThreads / L;
  const int lane = static_cast<int>(threadIdx.x) % L;
  const int64_t head = static_cast<int64_t>(blockIdx.x) * kHeadsPerBlock + threadIdx.x / L;
  const bool active = head < heads_total;
  const int64_t t = active ? head / heads : 0, h = active ? head % heads : 0;
  T* p = x + t * row_stride + h * head_stride;
  P v;
  float sq = 0.f;
  if (active) {
    v = reinterpret_cast<const P*>(p)[lane];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float f = Num<T>::ToF(v.v[i]);
      sq += f * f;
    }
  }
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  const float inv_rms = rsqrtf(sq * inv_dim + eps);
  const P w = reinterpret_cast<const P*>(weight)[lane];
  P y;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float normed = active ? RoundTo<T>(Num<T>::ToF(v.v[i]) * inv_rms) : 0.f;
    y.v[i] = Num<T>::FromF(Num<T>::ToF(w.v[i]) * normed);
  }
  const int rotary_packs = rotary_dim / kVec, half = rotary_packs / 2;
  if (rotary_packs > 0) {
    // The partner's pack, moved as four 32-bit words (a lane outside the
    // prefix reads its own, unused).
    const int partner = lane >= rotary_packs ? lane : (lane < half ? lane + half : lane - half);
    const int src = static_cast<int>(threadIdx.x % 32) - lane + partner;
    P u;
    const auto* yw = reinterpret_cast<const uint32_t*>(&y);
    auto* uw = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
    for (int j = 0; j < static_cast<int>(sizeof(P) / 4); ++j) uw[j] = __shfl_sync(0xffffffffu, yw[j], src);
    if (active && lane < rotary_packs) {
      const P c = reinterpret_cast<const P*>(cos + t * rotary_dim)[lane];
      const P s = reinterpret_cast<const P*>(sin + t * rotary_dim)[lane];
      // rotate_half(x) = cat(-x2, x1); each product is a stored tensor.
      const float sign = lane < half ? -1.f : 1.f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        y.v[i] = Num<T>::FromF(RoundTo<T>(Num<T>::ToF(y.v[i]) * Num<T>::ToF(c.v[i])) +
                               RoundTo<T>(sign * Num<T>::ToF(u.v[i]) * Num<T>::ToF(s.v[i])));
      }
    }
  }
  if (active) reinterpret_cast<P*>(p)[lane] = y;
}

template <typename T, int L>
void LaunchHeadNormRope(void* x, int64_t heads_total, int64_t heads, int64_t row_stride, int64_t head_stride,
                        const void* weight, float inv_dim, float eps, int rotary_dim, const void* cos,
                        const void* sin, cudaStream_t stream) {
  constexpr int64_t kHeadsPerBlock = kThreads / L;
  const auto blocks = static_cast<unsigned>((heads_total + kHeadsPerBlock - 1) / kHeadsPerBlock);
  HeadNormRopeKernel<T, L><<<blocks, kThreads, 0, stream>>>(
      static_cast<T*>(x), heads_total, heads, row_stride, head_stride, static_cast<const T*>(weight), inv_dim, eps,
      rotary_dim, static_cast<const T*>(cos), static_cast<const T*>(sin));
}

template <typename T>
bool DispatchHeadNormRope(int lanes, void* x, int64_t heads_total, int64_t heads, int64_t row_stride,
                          int64_t head_stride, const void* weight, float inv_dim, float eps, int rotary_dim,
                          const void* cos, const void* sin, cudaStream_t stream) {
  switch (lanes) {
#define E3_HEAD_NORM_ROPE_CASE(L)                                                                                  \
  case L:                                                                                                          \
    LaunchHeadNormRope<T, L>(x, heads_total, heads, row_stride, head_stride, weight, inv_dim, eps, rotary_dim, cos, \
                             sin, stream);                                                                         \
    return true;
    E3_HEAD_NORM_ROPE_CASE(1)
    E3_HEAD_NORM_ROPE_CASE(2)
    E3_HEAD_NORM_ROPE_CASE(4)
    E3_HEAD_NORM_ROPE_CASE(8)
    E3_HEAD_NORM_ROPE_CASE(16)
    E3_HEAD_NORM_ROPE_CASE(32)
#undef E3_HEAD_NORM_ROPE_CASE
    default:
      return false;
  }
}

}  // namespace

bool HeadRmsNormRopeInPlace(Dtype dtype, void* x, int64_t tokens, int64_t heads, int64_t row_stride,
                            int64_t head_stride, int64_t head_dim, const void* weight, float eps, int64_t rotary_dim,
                            const void* cos, const void* sin, void* stream) {
  const int64_t lanes = head_dim / kVec;
  if (tokens <= 0 || heads <= 0 || head_dim % kVec != 0 || lanes > 32 || (lanes & (lanes - 1)) != 0) return false;
  if (row_stride % kVec != 0 || head_stride % kVec != 0 || !Aligned16OrNull(x) || !Aligned16OrNull(weight)) {
    return false;
  }
  // Rotation halves of whole packs, within the head.
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % (2 * kVec) != 0) return false;
  if (rotary_dim > 0 && (cos == nullptr || sin == nullptr || !Aligned16OrNull(cos) || !Aligned16OrNull(sin))) {
    return false;
  }
  const int64_t heads_total = tokens * heads;
  if ((heads_total + kThreads / lanes - 1) / (kThreads / lanes) > 0x7fffffff) return false;
  auto s = static_cast<cudaStream_t>(stream);
  const float inv_dim = 1.f / static_cast<float>(head_dim);
  const int rot = static_cast<int>(rotary_dim);
  const int l = static_cast<int>(lanes);
  if (dtype == Dtype::kBFloat16) {
    return DispatchHeadNormRope<__nv_bfloat16>(l, x, heads_total, heads, row_stride, head_stride, weight, inv_dim, eps,
                                               rot, cos, sin, s);
  }
  return DispatchHeadNormRope<__half>(l, x, heads_total, heads, row_stride, head_stride, weight, inv_dim, eps, rot,
                                      cos, sin, s);
}

}  // namespace e3::kernels
