// TTT attention's diagonal keys, merged into flash attention's causal
// block through its log-sum-exp (see student_ops.h). A group of lanes
// per (token, query head) row: each lane holds 8 or 16 consecutive
// features (16-byte accesses for 16-bit rows), every dot product is a sum
// over the group, and a warp holds several rows. (A whole warp per row,
// 4 features a lane, is bound by instruction issue, not by memory.) The
// backward's key and value gradients sum over the query heads that share
// a kv head, so a second kernel takes one group per (token, kv head) and
// reads the first's per-head probabilities and score gradients from a
// small scratch buffer.
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;
// Features per lane: 16 in the forward (two 16-byte accesses; faster
// than 8), 8 in the backward kernels (16 needs 96-198 registers, which
// leaves too few resident warps).
constexpr int kForwardPerLane = 16, kBackwardPerLane = 8;

struct DiagGrads {
  float* dk[kMaxDiagKeys];
  float* dv[kMaxDiagKeys];
};

// This thread's row among the grid's rows, kLanes lanes per row. Rows past
// `rows` (the grid's last warp) read the last row and write nothing: every
// lane stays for the group sums.
template <int kLanes>
struct RowOf {
  int64_t row;
  bool valid;
  __device__ __forceinline__ explicit RowOf(int64_t rows) {
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    const int64_t r = warp * (32 / kLanes) + (threadIdx.x & 31) / kLanes;
    valid = r < rows;
    row = valid ? r : rows - 1;
  }
};

template <int kLanes>
__device__ __forceinline__ int LaneInRow() {
  return threadIdx.x & (kLanes - 1);
}

// The sum over this row's kLanes lanes, returned to each of them.
template <int kLanes>
__device__ __forceinline__ float GroupSum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The kv head query head h reads (GQA).
__device__ __forceinline__ int64_t KvHeadOf(const TttAttentionShape& s, int64_t h) {
  return h / (s.q_heads / s.kv_heads);
}

// This lane's kPerLane consecutive features of the row at p, read in
// 16-byte accesses where the address allows (it does for every view the step passes: head
// offsets are multiples of head_dim), else one by one.
template <typename T, int kLanes, int kPerLane>
__device__ __forceinline__ void LoadLane(const T* p, float (&v)[kPerLane]) {
  using P = Pack<T, kPerLane>;
  const T* at = p + LaneInRow<kLanes>() * kPerLane;
  if (reinterpret_cast<uintptr_t>(at) % sizeof(P) == 0) {
    const P pack = *reinterpret_cast<const P*>(at);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) v[e] = Num<T>::ToF(pack.v[e]);
    return;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) v[e] = Num<T>::ToF(at[e]);
}

// The same for fp32 rows: float4 accesses where aligned.
template <int kLanes, int kPerLane>
__device__ __forceinline__ void StoreLaneF(float* p, const float (&v)[kPerLane]) {
  float* at = p + LaneInRow<kLanes>() * kPerLane;
  if (Aligned16(at)) {
#pragma unroll
    for (int e = 0; e < kPerLane; e += 4) {
      *reinterpret_cast<float4*>(at + e) = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) at[e] = v[e];
}
template <int kLanes, int kPerLane>
__device__ __forceinline__ void AddLaneF(float* p, const float (&v)[kPerLane]) {
  float* at = p + LaneInRow<kLanes>() * kPerLane;
  if (Aligned16(at)) {
#pragma unroll
    for (int e = 0; e < kPerLane; e += 4) {
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
template <typename T, int kLanes, int kPerLane>
__device__ __forceinline__ void StoreLane(T* p, const float (&v)[kPerLane]) {
  using P = Pack<T, kPerLane>;
  T* at = p + LaneInRow<kLanes>() * kPerLane;
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

template <int kLanes, int kPerLane>
__device__ __forceinline__ float Dot(const float (&a)[kPerLane], const float (&b)[kPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) s += a[e] * b[e];
  return GroupSum<kLanes>(s);
}

template <typename T, int kLanes, int kPerLane = kForwardPerLane>
__global__ void DiagForwardKernel(TttAttentionShape s, const T* __restrict__ q, DiagKeys diag,
                                  const T* __restrict__ o_blk, const float* __restrict__ lse_blk,
                                  T* __restrict__ o, float* __restrict__ lse) {
  const RowOf<kLanes> r(s.tokens * s.q_heads);
  const int64_t t = r.row / s.q_heads, h = r.row % s.q_heads;
  const int64_t kv_at = t * s.qkv_row + KvHeadOf(s, h) * s.head_dim;
  float qv[kPerLane];
  LoadLane<T, kLanes, kPerLane>(q + t * s.qkv_row + h * s.head_dim, qv);
  float scores[kMaxDiagKeys];
  const float lb = lse_blk[h * s.tokens + t];
  float m = lb;
#pragma unroll
  for (int i = 0; i < kMaxDiagKeys; ++i) {
    if (i < diag.num_diag) {
      float kv[kPerLane];
      LoadLane<T, kLanes, kPerLane>(static_cast<const T*>(diag.keys[i]) + kv_at, kv);
      scores[i] = s.scale * Dot<kLanes, kPerLane>(qv, kv);
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
  LoadLane<T, kLanes, kPerLane>(o_blk + r.row * s.head_dim, acc);
  const float w_blk = expf(lb - l);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] *= w_blk;
#pragma unroll
  for (int i = 0; i < kMaxDiagKeys; ++i) {
    if (i < diag.num_diag) {
      float vv[kPerLane];
      LoadLane<T, kLanes, kPerLane>(static_cast<const T*>(diag.values[i]) + kv_at, vv);
      const float p = expf(scores[i] - l);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] += p * vv[e];
    }
  }
  if (!r.valid) return;
  StoreLane<T, kLanes, kPerLane>(o + r.row * s.head_dim, acc);
  if (LaneInRow<kLanes>() == 0) lse[h * s.tokens + t] = l;
}

// Scratch layout: [2][kMaxDiagKeys][tokens][q_heads]: p, then ds.
__device__ __forceinline__ int64_t ScratchAt(const TttAttentionShape& s, int which, int i,
                                             int64_t t, int64_t h) {
  return ((static_cast<int64_t>(which) * kMaxDiagKeys + i) * s.tokens + t) * s.q_heads + h;
}

template <typename T, int kLanes, int kPerLane = kBackwardPerLane>
__global__ void DiagBackwardQueryKernel(TttAttentionShape s, const T* __restrict__ q, DiagKeys diag,
                                        const T* __restrict__ o, const float* __restrict__ lse,
                                        const T* __restrict__ d_o, const T* __restrict__ dq_blk,
                                        float* __restrict__ dq, float* __restrict__ scratch) {
  const RowOf<kLanes> r(s.tokens * s.q_heads);
  const int64_t t = r.row / s.q_heads, h = r.row % s.q_heads;
  const int64_t at = r.row * s.head_dim;
  float dov[kPerLane], acc[kPerLane];
  LoadLane<T, kLanes, kPerLane>(d_o + at, dov);
  LoadLane<T, kLanes, kPerLane>(dq_blk + at, acc);
  const bool writer = r.valid && LaneInRow<kLanes>() == 0;
  if (diag.num_diag > 0) {
    float ov[kPerLane], qv[kPerLane];
    LoadLane<T, kLanes, kPerLane>(o + at, ov);
    LoadLane<T, kLanes, kPerLane>(q + t * s.qkv_row + h * s.head_dim, qv);
    const float d_sum = Dot<kLanes, kPerLane>(dov, ov);
    const float l = lse[h * s.tokens + t];
    const int64_t kv_at = t * s.qkv_row + KvHeadOf(s, h) * s.head_dim;
    for (int i = 0; i < diag.num_diag; ++i) {
      float kv[kPerLane], vv[kPerLane];
      LoadLane<T, kLanes, kPerLane>(static_cast<const T*>(diag.keys[i]) + kv_at, kv);
      LoadLane<T, kLanes, kPerLane>(static_cast<const T*>(diag.values[i]) + kv_at, vv);
      const float p = expf(s.scale * Dot<kLanes, kPerLane>(qv, kv) - l);
      const float ds = p * (Dot<kLanes, kPerLane>(dov, vv) - d_sum);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] += s.scale * ds * kv[e];
      if (writer) {
        scratch[ScratchAt(s, 0, i, t, h)] = p;
        scratch[ScratchAt(s, 1, i, t, h)] = ds;
      }
    }
  }
  if (r.valid) StoreLaneF<kLanes, kPerLane>(dq + at, acc);
}

// Diagonal keys per pass of the key kernel: each query head's q and dO
// rows are read once per pass (not once per key), while the pass's key
// and value gradients stay in registers.
constexpr int kKeysPerPass = 4;

template <typename T, int kLanes, int kPerLane = kBackwardPerLane>
__global__ void DiagBackwardKeyKernel(TttAttentionShape s, const T* __restrict__ q,
                                      const T* __restrict__ d_o, int num_diag, DiagGrads grads,
                                      const float* __restrict__ scratch) {
  const RowOf<kLanes> r(s.tokens * s.kv_heads);
  if (!r.valid) return;  // no group sums below
  const int64_t t = r.row / s.kv_heads, kvh = r.row % s.kv_heads;
  const int64_t group = s.q_heads / s.kv_heads;
  for (int first = 0; first < num_diag; first += kKeysPerPass) {
    float dk[kKeysPerPass][kPerLane] = {}, dv[kKeysPerPass][kPerLane] = {};
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kvh * group + g;
      float qv[kPerLane], dov[kPerLane];
      LoadLane<T, kLanes, kPerLane>(q + t * s.qkv_row + h * s.head_dim, qv);
      LoadLane<T, kLanes, kPerLane>(d_o + (t * s.q_heads + h) * s.head_dim, dov);
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
    const int64_t at = r.row * s.head_dim;
#pragma unroll
    for (int k = 0; k < kKeysPerPass; ++k) {
      const int i = first + k;
      if (i >= num_diag) break;
      AddLaneF<kLanes, kPerLane>(grads.dk[i] + at, dk[k]);
      AddLaneF<kLanes, kPerLane>(grads.dv[i] + at, dv[k]);
    }
  }
}

bool ShapeTakes(const TttAttentionShape& s, int num_diag, int min_diag) {
  auto lanes_fit = [&](int64_t per_lane) {
    const int64_t lanes = s.head_dim / per_lane;
    return s.head_dim % per_lane == 0 && lanes >= 2 && lanes <= 32 && (lanes & (lanes - 1)) == 0;
  };
  return s.tokens > 0 && s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0 &&
         lanes_fit(kForwardPerLane) && lanes_fit(kBackwardPerLane) && num_diag >= min_diag &&
         num_diag <= kMaxDiagKeys;
}

// Blocks for `rows` rows at kLanes lanes per row.
int64_t RowBlocks(int64_t rows, int64_t lanes) {
  const int64_t warps = (rows * lanes + 31) / 32;
  return (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
}

// Calls f with the lanes per row (head_dim / features per lane) as a
// compile-time constant.
template <typename F>
void WithLanes(int64_t lanes, F&& f) {
  switch (lanes) {
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    default:
      f(std::integral_constant<int, 32>{});
      break;
  }
}

}  // namespace

bool TttDiagForward(Dtype dtype, const TttAttentionShape& shape, const void* q,
                    const DiagKeys& diag, const void* o_blk, const float* lse_blk, void* o,
                    float* lse, void* stream) {
  if (!ShapeTakes(shape, diag.num_diag, 1)) return false;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    WithLanes(shape.head_dim / kForwardPerLane, [&](auto lanes) {
      constexpr int kLanes = decltype(lanes)::value;
      DiagForwardKernel<T, kLanes>
          <<<RowBlocks(shape.tokens * shape.q_heads, kLanes), kWarpsPerBlock * 32, 0,
             AsStream(stream)>>>(shape, static_cast<const T*>(q), diag,
                                 static_cast<const T*>(o_blk), lse_blk, static_cast<T*>(o), lse);
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
    WithLanes(shape.head_dim / kBackwardPerLane, [&](auto lanes) {
      constexpr int kLanes = decltype(lanes)::value;
      DiagBackwardQueryKernel<T, kLanes>
          <<<RowBlocks(shape.tokens * shape.q_heads, kLanes), kWarpsPerBlock * 32, 0,
             AsStream(stream)>>>(shape, static_cast<const T*>(q), diag,
                                 static_cast<const T*>(o), lse, static_cast<const T*>(do_),
                                 static_cast<const T*>(dq_blk), dq, scratch);
      if (diag.num_diag > 0) {
        DiagBackwardKeyKernel<T, kLanes>
            <<<RowBlocks(shape.tokens * shape.kv_heads, kLanes), kWarpsPerBlock * 32, 0,
               AsStream(stream)>>>(shape, static_cast<const T*>(q), static_cast<const T*>(do_),
                                   diag.num_diag, grads, scratch);
      }
    });
    return true;
  });
}

}  // namespace e3::kernels
