// TTT attention's diagonal keys, merged into flash attention's causal
// block through its log-sum-exp (see student_kernels.h). One warp per
// (token, query head): each lane holds head_dim / 32 consecutive features,
// and every dot product is a warp sum. The backward's key and value
// gradients sum over the query heads that share a kv head, so a second
// kernel takes one warp per (token, kv head) and reads the first's
// per-head probabilities and score gradients from a small scratch buffer.
#include <type_traits>

#include "student_trainer/kernels/kernel_common.cuh"

namespace e3::student_kernels {
namespace {

constexpr int kWarpsPerBlock = 8;

struct DiagGrads {
  float* dk[kMaxDiagKeys];
  float* dv[kMaxDiagKeys];
};

// This thread's warp among the grid's: one (token, head) row each.
__device__ __forceinline__ int64_t WarpIndex() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
}
// The kv head query head h reads (GQA).
__device__ __forceinline__ int64_t KvHeadOf(const TttAttentionShape& s, int64_t h) {
  return h / (s.q_heads / s.kv_heads);
}

// This lane's kPerLane consecutive features of the row at p, read as one
// 4-16 byte access where the address allows (it does for every view the
// step passes: head offsets are multiples of head_dim), else one by one.
template <typename T, int kPerLane>
__device__ __forceinline__ void LoadLane(const T* p, float (&v)[kPerLane]) {
  using P = Pack<T, kPerLane>;
  const T* at = p + (threadIdx.x & 31) * kPerLane;
  if (reinterpret_cast<uintptr_t>(at) % sizeof(P) == 0) {
    const P pack = *reinterpret_cast<const P*>(at);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) v[e] = Num<T>::ToF(pack.v[e]);
    return;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) v[e] = Num<T>::ToF(at[e]);
}

// The same for fp32 rows: float4 accesses when kPerLane is a multiple of 4.
template <int kPerLane>
__device__ __forceinline__ bool Float4Lane(const float* at) {
  return kPerLane % 4 == 0 && reinterpret_cast<uintptr_t>(at) % 16 == 0;
}
template <int kPerLane>
__device__ __forceinline__ void StoreLaneF(float* p, const float (&v)[kPerLane]) {
  float* at = p + (threadIdx.x & 31) * kPerLane;
  if (Float4Lane<kPerLane>(at)) {
#pragma unroll
    for (int e = 0; e + 3 < kPerLane; e += 4) {
      *reinterpret_cast<float4*>(at + e) = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) at[e] = v[e];
}
template <int kPerLane>
__device__ __forceinline__ void AddLaneF(float* p, const float (&v)[kPerLane]) {
  float* at = p + (threadIdx.x & 31) * kPerLane;
  if (Float4Lane<kPerLane>(at)) {
#pragma unroll
    for (int e = 0; e + 3 < kPerLane; e += 4) {
      float4 x = *reinterpret_cast<float4*>(at + e);
      x.x += v[e];
      x.y += v[e + 1];
      x.z += v[e + 2];
      x.w += v[e + 3];
      *reinterpret_cast<float4*>(at + e) = x;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) at[e] += v[e];
}

// This lane's features written to a 16-bit row.
template <typename T, int kPerLane>
__device__ __forceinline__ void StoreLane(T* p, const float (&v)[kPerLane]) {
  using P = Pack<T, kPerLane>;
  T* at = p + (threadIdx.x & 31) * kPerLane;
  P pack;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) pack.v[e] = Num<T>::FromF(v[e]);
  if (reinterpret_cast<uintptr_t>(at) % sizeof(P) == 0) {
    *reinterpret_cast<P*>(at) = pack;
    return;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) at[e] = pack.v[e];
}

template <int kPerLane>
__device__ __forceinline__ float Dot(const float (&a)[kPerLane], const float (&b)[kPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) s += a[e] * b[e];
  return WarpSum(s);
}

template <typename T, int kPerLane>
__global__ void DiagForwardKernel(TttAttentionShape s, const T* __restrict__ q, DiagKeys diag,
                                  const T* __restrict__ o_blk, const float* __restrict__ lse_blk,
                                  T* __restrict__ o, float* __restrict__ lse) {
  const int64_t warp = WarpIndex();
  if (warp >= s.tokens * s.q_heads) return;
  const int64_t t = warp / s.q_heads, h = warp % s.q_heads;
  const int64_t kvh = KvHeadOf(s, h);
  float qv[kPerLane];
  LoadLane<T, kPerLane>(q + t * s.qkv_row + h * s.head_dim, qv);
  float scores[kMaxDiagKeys];
  const float lb = lse_blk[h * s.tokens + t];
  float m = lb;
#pragma unroll
  for (int i = 0; i < kMaxDiagKeys; ++i) {
    if (i < diag.num_diag) {
      float kv[kPerLane];
      LoadLane<T, kPerLane>(static_cast<const T*>(diag.keys[i]) + t * s.qkv_row + kvh * s.head_dim,
                            kv);
      scores[i] = s.scale * Dot<kPerLane>(qv, kv);
      m = fmaxf(m, scores[i]);
    }
  }
  float sum = expf(lb - m);
#pragma unroll
  for (int i = 0; i < kMaxDiagKeys; ++i) {
    if (i < diag.num_diag) sum += expf(scores[i] - m);
  }
  const float l = m + logf(sum);
  float acc[kPerLane];
  LoadLane<T, kPerLane>(o_blk + (t * s.q_heads + h) * s.head_dim, acc);
  const float w_blk = expf(lb - l);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] *= w_blk;
#pragma unroll
  for (int i = 0; i < kMaxDiagKeys; ++i) {
    if (i < diag.num_diag) {
      float vv[kPerLane];
      LoadLane<T, kPerLane>(
          static_cast<const T*>(diag.values[i]) + t * s.qkv_row + kvh * s.head_dim, vv);
      const float p = expf(scores[i] - l);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] += p * vv[e];
    }
  }
  StoreLane<T, kPerLane>(o + (t * s.q_heads + h) * s.head_dim, acc);
  if ((threadIdx.x & 31) == 0) lse[h * s.tokens + t] = l;
}

// Scratch layout: [2][kMaxDiagKeys][tokens][q_heads]: p, then ds.
__device__ __forceinline__ int64_t ScratchAt(const TttAttentionShape& s, int which, int i,
                                             int64_t t, int64_t h) {
  return ((static_cast<int64_t>(which) * kMaxDiagKeys + i) * s.tokens + t) * s.q_heads + h;
}

template <typename T, int kPerLane>
__global__ void DiagBackwardQueryKernel(TttAttentionShape s, const T* __restrict__ q, DiagKeys diag,
                                        const T* __restrict__ o, const float* __restrict__ lse,
                                        const T* __restrict__ d_o, const T* __restrict__ dq_blk,
                                        float* __restrict__ dq, float* __restrict__ scratch) {
  const int64_t warp = WarpIndex();
  if (warp >= s.tokens * s.q_heads) return;
  const int64_t t = warp / s.q_heads, h = warp % s.q_heads;
  const int64_t kvh = KvHeadOf(s, h);
  const int64_t row = (t * s.q_heads + h) * s.head_dim;
  float dov[kPerLane], acc[kPerLane];
  LoadLane<T, kPerLane>(d_o + row, dov);
  LoadLane<T, kPerLane>(dq_blk + row, acc);
  const int lane = threadIdx.x & 31;
  if (diag.num_diag > 0) {
    float ov[kPerLane], qv[kPerLane];
    LoadLane<T, kPerLane>(o + row, ov);
    LoadLane<T, kPerLane>(q + t * s.qkv_row + h * s.head_dim, qv);
    const float d_sum = Dot<kPerLane>(dov, ov);
    const float l = lse[h * s.tokens + t];
    for (int i = 0; i < diag.num_diag; ++i) {
      float kv[kPerLane], vv[kPerLane];
      const int64_t at = t * s.qkv_row + kvh * s.head_dim;
      LoadLane<T, kPerLane>(static_cast<const T*>(diag.keys[i]) + at, kv);
      LoadLane<T, kPerLane>(static_cast<const T*>(diag.values[i]) + at, vv);
      const float p = expf(s.scale * Dot<kPerLane>(qv, kv) - l);
      const float ds = p * (Dot<kPerLane>(dov, vv) - d_sum);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] += s.scale * ds * kv[e];
      if (lane == 0) {
        scratch[ScratchAt(s, 0, i, t, h)] = p;
        scratch[ScratchAt(s, 1, i, t, h)] = ds;
      }
    }
  }
  StoreLaneF<kPerLane>(dq + row, acc);
}

// Diagonal keys per pass of the key kernel: each query head's q and dO
// rows are read once per pass (not once per key), while the pass's key
// and value gradients stay in registers.
constexpr int kKeysPerPass = 4;

template <typename T, int kPerLane>
__global__ void DiagBackwardKeyKernel(TttAttentionShape s, const T* __restrict__ q,
                                      const T* __restrict__ d_o, int num_diag, DiagGrads grads,
                                      const float* __restrict__ scratch) {
  const int64_t warp = WarpIndex();
  if (warp >= s.tokens * s.kv_heads) return;
  const int64_t t = warp / s.kv_heads, kvh = warp % s.kv_heads;
  const int64_t group = s.q_heads / s.kv_heads;
  for (int first = 0; first < num_diag; first += kKeysPerPass) {
    float dk[kKeysPerPass][kPerLane] = {}, dv[kKeysPerPass][kPerLane] = {};
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kvh * group + g;
      float qv[kPerLane], dov[kPerLane];
      LoadLane<T, kPerLane>(q + t * s.qkv_row + h * s.head_dim, qv);
      LoadLane<T, kPerLane>(d_o + (t * s.q_heads + h) * s.head_dim, dov);
#pragma unroll
      for (int k = 0; k < kKeysPerPass; ++k) {
        const int i = first + k;
        if (i >= num_diag) break;
        const float p = scratch[ScratchAt(s, 0, i, t, h)];
        const float ds = s.scale * scratch[ScratchAt(s, 1, i, t, h)];
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          dk[k][e] += ds * qv[e];
          dv[k][e] += p * dov[e];
        }
      }
    }
    const int64_t at = (t * s.kv_heads + kvh) * s.head_dim;
#pragma unroll
    for (int k = 0; k < kKeysPerPass; ++k) {
      const int i = first + k;
      if (i >= num_diag) break;
      AddLaneF<kPerLane>(grads.dk[i] + at, dk[k]);
      AddLaneF<kPerLane>(grads.dv[i] + at, dv[k]);
    }
  }
}

bool ShapeTakes(const TttAttentionShape& s, int num_diag, int min_diag) {
  return s.tokens > 0 && s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0 &&
         s.head_dim % 32 == 0 && s.head_dim <= 256 &&
         (s.head_dim / 32 & (s.head_dim / 32 - 1)) == 0 && num_diag >= min_diag &&
         num_diag <= kMaxDiagKeys;
}

int64_t WarpBlocks(int64_t warps) { return (warps + kWarpsPerBlock - 1) / kWarpsPerBlock; }

// Calls f with the per-lane feature count as a compile-time constant.
template <typename F>
void WithPerLane(int64_t head_dim, F&& f) {
  switch (head_dim / 32) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
}

}  // namespace

bool TttDiagForward(Dtype dtype, const TttAttentionShape& shape, const void* q,
                    const DiagKeys& diag, const void* o_blk, const float* lse_blk, void* o,
                    float* lse, void* stream) {
  if (!ShapeTakes(shape, diag.num_diag, 1)) return false;
  const int64_t blocks = WarpBlocks(shape.tokens * shape.q_heads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    WithPerLane(shape.head_dim, [&](auto per_lane) {
      DiagForwardKernel<T, decltype(per_lane)::value>
          <<<blocks, kWarpsPerBlock * 32, 0, AsStream(stream)>>>(shape, static_cast<const T*>(q),
                                                                 diag, static_cast<const T*>(o_blk),
                                                                 lse_blk, static_cast<T*>(o), lse);
    });
    return true;
  });
}

int64_t TttDiagScratchFloats(const TttAttentionShape& shape) {
  return 2 * kMaxDiagKeys * shape.tokens * shape.q_heads;
}

bool TttDiagBackward(Dtype dtype, const TttAttentionShape& shape, const void* q,
                     const DiagKeys& diag, const void* o, const float* lse, const void* do_,
                     const void* dq_blk, float* dq, float* const* dk, float* const* dv,
                     float* scratch, void* stream) {
  if (!ShapeTakes(shape, diag.num_diag, 0)) return false;
  DiagGrads grads;
  for (int i = 0; i < diag.num_diag; ++i) {
    grads.dk[i] = dk[i];
    grads.dv[i] = dv[i];
  }
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    WithPerLane(shape.head_dim, [&](auto per_lane) {
      constexpr int kPerLane = decltype(per_lane)::value;
      DiagBackwardQueryKernel<T, kPerLane>
          <<<WarpBlocks(shape.tokens * shape.q_heads), kWarpsPerBlock * 32, 0, AsStream(stream)>>>(
              shape, static_cast<const T*>(q), diag, static_cast<const T*>(o), lse,
              static_cast<const T*>(do_), static_cast<const T*>(dq_blk), dq, scratch);
      if (diag.num_diag > 0) {
        DiagBackwardKeyKernel<T, kPerLane>
            <<<WarpBlocks(shape.tokens * shape.kv_heads), kWarpsPerBlock * 32, 0,
               AsStream(stream)>>>(shape, static_cast<const T*>(q), static_cast<const T*>(do_),
                                   diag.num_diag, grads, scratch);
      }
    });
    return true;
  });
}

}  // namespace e3::student_kernels
