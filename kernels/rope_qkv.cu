// Rotary embedding of a fused q/k/v projection and its backward (see
// student_ops.h). A thread takes one 16-byte pack of a head: a pack in
// the first half of the rotated features also computes its partner pack
// in the second half; packs past rotary_dim and the v heads are copied.
#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;

struct RopeShape {
  int64_t tokens, heads, rotated_heads, head_dim, half;  // half = rotary_dim / 2
  int64_t packs_per_head;
};

// What the thread with flat index i does: its token, head and pack, and
// whether it rotates a pair (pack p and p + half / 8), copies, or idles
// (the second pack of a pair, done by its partner).
enum class PackRole { kRotatePair, kCopy, kPartner };
struct PackAt {
  int64_t t, h, p;
  PackRole role;
};

__device__ __forceinline__ PackAt Locate(const RopeShape& s, int64_t i) {
  PackAt a;
  a.p = i % s.packs_per_head;
  const int64_t th = i / s.packs_per_head;
  a.h = th % s.heads;
  a.t = th / s.heads;
  const int64_t half_packs = s.half / kVec;
  if (a.h >= s.rotated_heads || a.p >= 2 * half_packs) {
    a.role = PackRole::kCopy;
  } else {
    a.role = a.p < half_packs ? PackRole::kRotatePair : PackRole::kPartner;
  }
  return a;
}

// cos and sin of token t at the two packs of a rotated pair.
template <typename T>
struct PairTables {
  Pack<T, kVec> c1, c2, s1, s2;
};
template <typename T>
__device__ __forceinline__ PairTables<T> LoadPairTables(const T* cos, const T* sin, int64_t t,
                                                        int64_t rotary_dim, int64_t d1,
                                                        int64_t d2) {
  using P = Pack<T, kVec>;
  const T* ct = cos + t * rotary_dim;
  const T* st = sin + t * rotary_dim;
  return {*reinterpret_cast<const P*>(ct + d1), *reinterpret_cast<const P*>(ct + d2),
          *reinterpret_cast<const P*>(st + d1), *reinterpret_cast<const P*>(st + d2)};
}

template <typename T>
__global__ void RopeQkvForwardKernel(const T* __restrict__ qkv, T* __restrict__ out,
                                     const T* __restrict__ cos, const T* __restrict__ sin,
                                     RopeShape s, int64_t rotary_dim) {
  using P = Pack<T, kVec>;
  const int64_t total = s.tokens * s.heads * s.packs_per_head;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PackAt a = Locate(s, i);
    if (a.role == PackRole::kPartner) continue;
    const int64_t head = (a.t * s.heads + a.h) * s.head_dim;
    if (a.role == PackRole::kCopy) {
      reinterpret_cast<P*>(out + head)[a.p] = reinterpret_cast<const P*>(qkv + head)[a.p];
      continue;
    }
    const int64_t d1 = a.p * kVec, d2 = d1 + s.half;
    const P x1 = *reinterpret_cast<const P*>(qkv + head + d1);
    const P x2 = *reinterpret_cast<const P*>(qkv + head + d2);
    const PairTables<T> r = LoadPairTables(cos, sin, a.t, rotary_dim, d1, d2);
    P y1, y2;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float a1 = Num<T>::ToF(x1.v[e]), a2 = Num<T>::ToF(x2.v[e]);
      y1.v[e] = Num<T>::FromF(a1 * Num<T>::ToF(r.c1.v[e]) - a2 * Num<T>::ToF(r.s1.v[e]));
      y2.v[e] = Num<T>::FromF(a2 * Num<T>::ToF(r.c2.v[e]) + a1 * Num<T>::ToF(r.s2.v[e]));
    }
    *reinterpret_cast<P*>(out + head + d1) = y1;
    *reinterpret_cast<P*>(out + head + d2) = y2;
  }
}

__device__ __forceinline__ void Load8(const float* p, float (&v)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The fp32 gradient row of head h at token t: dq, then dk, then dv.
__device__ __forceinline__ const float* GradHead(const float* dq, const float* dk, const float* dv,
                                                 const RopeShape& s, int64_t q_heads,
                                                 int64_t kv_heads, int64_t t, int64_t h) {
  if (h < q_heads) return dq + (t * q_heads + h) * s.head_dim;
  if (h < q_heads + kv_heads) return dk + (t * kv_heads + (h - q_heads)) * s.head_dim;
  return dv + (t * kv_heads + (h - q_heads - kv_heads)) * s.head_dim;
}

template <typename T>
__global__ void RopeQkvBackwardKernel(const float* __restrict__ dq, const float* __restrict__ dk,
                                      const float* __restrict__ dv, T* __restrict__ d_qkv,
                                      const T* __restrict__ cos, const T* __restrict__ sin,
                                      RopeShape s, int64_t q_heads, int64_t kv_heads,
                                      int64_t rotary_dim) {
  using P = Pack<T, kVec>;
  const int64_t total = s.tokens * s.heads * s.packs_per_head;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PackAt a = Locate(s, i);
    if (a.role == PackRole::kPartner) continue;
    const float* g = GradHead(dq, dk, dv, s, q_heads, kv_heads, a.t, a.h);
    T* out = d_qkv + (a.t * s.heads + a.h) * s.head_dim;
    if (a.role == PackRole::kCopy) {
      float v[kVec];
      Load8(g + a.p * kVec, v);
      P o;
#pragma unroll
      for (int e = 0; e < kVec; ++e) o.v[e] = Num<T>::FromF(v[e]);
      reinterpret_cast<P*>(out)[a.p] = o;
      continue;
    }
    const int64_t d1 = a.p * kVec, d2 = d1 + s.half;
    float g1[kVec], g2[kVec];
    Load8(g + d1, g1);
    Load8(g + d2, g2);
    const PairTables<T> r = LoadPairTables(cos, sin, a.t, rotary_dim, d1, d2);
    // y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2, so
    // dx1 = dy1 c1 + dy2 s2 and dx2 = dy2 c2 - dy1 s1.
    P y1, y2;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      y1.v[e] = Num<T>::FromF(g1[e] * Num<T>::ToF(r.c1.v[e]) + g2[e] * Num<T>::ToF(r.s2.v[e]));
      y2.v[e] = Num<T>::FromF(g2[e] * Num<T>::ToF(r.c2.v[e]) - g1[e] * Num<T>::ToF(r.s1.v[e]));
    }
    *reinterpret_cast<P*>(out + d1) = y1;
    *reinterpret_cast<P*>(out + d2) = y2;
  }
}

bool ShapeTakes(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                int64_t rotary_dim) {
  return tokens > 0 && q_heads > 0 && kv_heads > 0 && head_dim % kVec == 0 && rotary_dim > 0 &&
         rotary_dim <= head_dim && rotary_dim % (2 * kVec) == 0;
}

RopeShape MakeShape(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                    int64_t rotary_dim) {
  return {tokens,   q_heads + 2 * kv_heads, q_heads + kv_heads,
          head_dim, rotary_dim / 2,         head_dim / kVec};
}

}  // namespace

bool RopeQkvForward(Dtype dtype, const void* qkv, void* out, int64_t tokens, int64_t q_heads,
                    int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, const void* cos,
                    const void* sin, void* stream) {
  if (!ShapeTakes(tokens, q_heads, kv_heads, head_dim, rotary_dim) || !Aligned16(qkv) ||
      !Aligned16(out) || !Aligned16(cos) || !Aligned16(sin)) {
    return false;
  }
  const RopeShape s = MakeShape(tokens, q_heads, kv_heads, head_dim, rotary_dim);
  const int64_t blocks = GridBlocks(tokens * s.heads * s.packs_per_head, kThreads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    RopeQkvForwardKernel<T><<<blocks, kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(qkv), static_cast<T*>(out), static_cast<const T*>(cos),
        static_cast<const T*>(sin), s, rotary_dim);
    return true;
  });
}

bool RopeQkvBackward(Dtype dtype, const float* dq, const float* dk, const float* dv, void* d_qkv,
                     int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                     int64_t rotary_dim, const void* cos, const void* sin, void* stream) {
  if (!ShapeTakes(tokens, q_heads, kv_heads, head_dim, rotary_dim) || !Aligned16(dq) ||
      !Aligned16(dk) || !Aligned16(dv) || !Aligned16(d_qkv) || !Aligned16(cos) || !Aligned16(sin)) {
    return false;
  }
  const RopeShape s = MakeShape(tokens, q_heads, kv_heads, head_dim, rotary_dim);
  const int64_t blocks = GridBlocks(tokens * s.heads * s.packs_per_head, kThreads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    RopeQkvBackwardKernel<T><<<blocks, kThreads, 0, AsStream(stream)>>>(
        dq, dk, dv, static_cast<T*>(d_qkv), static_cast<const T*>(cos), static_cast<const T*>(sin),
        s, q_heads, kv_heads, rotary_dim);
    return true;
  });
}

}  // namespace e3::kernels
