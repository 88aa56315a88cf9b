// See fp8_argmax.h. The quantisation and the rescoring take one row per
// block of 256 threads, the top-8 kernel one row per warp; all read rows
// in 16-byte packs (8 bf16).
#include "kernels/fp8_argmax.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/argmax_key.h"
#include "kernels/common.cuh"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int K = kFp8ArgmaxCandidates;
constexpr float kE4m3Max = 448.f;
static_assert(kThreads / 32 == K, "RescoreKernel gives each candidate one warp");

struct alignas(16) Bf16x8 {
  __nv_bfloat162 v[4];
};

__device__ __forceinline__ unsigned long long WarpMax(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// The maximum over the block, returned to every thread. `smem` holds one
// entry per warp; the leading barrier lets consecutive calls reuse it.
__device__ unsigned long long BlockMax(unsigned long long v, unsigned long long* smem) {
  v = WarpMax(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : 0ull;
  return WarpMax(v);
}

__global__ void __launch_bounds__(kThreads)
    QuantizeRowsKernel(const __nv_bfloat16* __restrict__ x, int64_t x_stride, int64_t cols, uint8_t* __restrict__ q,
                       float* __restrict__ scale, uint8_t* __restrict__ nonfinite) {
  __shared__ unsigned long long smem[32];
  const int64_t r = blockIdx.x;
  const auto* row = reinterpret_cast<const Bf16x8*>(x + r * x_stride);
  const int64_t packs = cols / kVec;
  float amax = 0.f;
  bool bad = false;
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    const Bf16x8 v = row[p];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(v.v[j]);
      bad |= !isfinite(f.x) || !isfinite(f.y);
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  const bool row_bad = __syncthreads_or(bad) != 0;
  // Non-negative floats order as their bit patterns.
  amax = __uint_as_float(static_cast<unsigned>(BlockMax(__float_as_uint(amax), smem)));
  const bool usable = !row_bad && amax > 0.f;
  // The clamp keeps a row of subnormals from an infinite factor.
  const float factor = usable ? fminf(kE4m3Max / amax, 3.0e38f) : 0.f;
  if (threadIdx.x == 0) {
    if (scale != nullptr) scale[r] = usable ? amax / kE4m3Max : 1.f;
    nonfinite[r] = row_bad ? 1 : 0;
  }
  auto* out = reinterpret_cast<uint2*>(q + r * cols);
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    uint32_t word[2] = {0u, 0u};
    if (usable) {
      const Bf16x8 v = row[p];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(v.v[j]);
        const __nv_fp8x2_storage_t two =
            __nv_cvt_float2_to_fp8x2(make_float2(f.x * factor, f.y * factor), __NV_SATFINITE, __NV_E4M3);
        word[j / 2] |= static_cast<uint32_t>(two) << (16 * (j % 2));
      }
    }
    out[p] = make_uint2(word[0], word[1]);
  }
}

// The value a key was made from (ArgmaxKey's inverse on its high word).
__device__ __forceinline__ float KeyValue(unsigned long long key) {
  const auto ordered = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered);
}

// One warp's K best keys so far, sorted: lane i < K holds the i-th best
// (0: empty). `floor` is the K-th best's value (warp-uniform; -inf until
// the list is full): a score below it cannot enter, which is what makes
// the scan cheap. Only scores at or above it reach Insert, warp-uniformly.
struct WarpTopK {
  unsigned long long entry = 0;
  float floor = -INFINITY;

  __device__ __forceinline__ void Insert(unsigned long long key, int lane) {
    const unsigned above = __ballot_sync(0xffffffffu, lane < K && entry > key);
    const int pos = __popc(above);
    if (pos >= K) return;  // warp-uniform
    const unsigned long long up = __shfl_up_sync(0xffffffffu, entry, 1);
    if (lane == pos) {
      entry = key;
    } else if (lane > pos && lane < K) {
      entry = up;
    }
    const unsigned long long last = __shfl_sync(0xffffffffu, entry, K - 1);
    floor = last == 0 ? -INFINITY : KeyValue(last);
  }
};

// A pack's 8 column scales (ones without scales, or past the row's end).
struct alignas(16) Scales8 {
  float4 a, b;
};

__device__ __forceinline__ Scales8 LoadScales(const float* __restrict__ col_scale, int64_t p, bool live) {
  if (!live || col_scale == nullptr) return {make_float4(1.f, 1.f, 1.f, 1.f), make_float4(1.f, 1.f, 1.f, 1.f)};
  return reinterpret_cast<const Scales8*>(col_scale)[p];
}

// Offers one 8-column pack per lane (columns p * 8 ...) to the warp's list.
// Every lane of the warp calls it together (ballots); a lane that is not
// `live` (past the row's end) offers nothing.
__device__ __forceinline__ void OfferPack(const Bf16x8& v, const Scales8& scale, int64_t p, int lane, bool live,
                                          WarpTopK& top) {
  float s[kVec] = {scale.a.x, scale.a.y, scale.a.z, scale.a.w, scale.b.x, scale.b.y, scale.b.z, scale.b.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(v.v[j]);
    s[2 * j] *= f.x;
    s[2 * j + 1] *= f.y;
  }
  // Once the list is full almost every pack lies wholly below the floor:
  // one compare of the pack's maximum settles it.
  float most = s[0];
#pragma unroll
  for (int j = 1; j < kVec; ++j) most = fmaxf(most, s[j]);
  uint32_t pending = 0;
  if (live && most >= top.floor) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) pending |= (s[j] >= top.floor ? 1u : 0u) << j;
  }
  // Ties with the floor go through too: the keys' column order decides.
  while (true) {
    const unsigned lanes = __ballot_sync(0xffffffffu, pending != 0);
    if (lanes == 0) return;
    const int src = __ffs(lanes) - 1;
    unsigned long long mine = 0;
    if (pending != 0) {
      const int j = __ffs(pending) - 1;
      float value = s[0];
#pragma unroll
      for (int jj = 1; jj < kVec; ++jj) value = j == jj ? s[jj] : value;
      mine = ArgmaxKey(value, static_cast<uint32_t>(p * kVec + j));
    }
    const unsigned long long key = __shfl_sync(0xffffffffu, mine, src);
    if (lane == src) pending &= pending - 1;
    top.Insert(key, lane);
    // The floor may have risen: drop what can no longer enter.
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (!(s[j] >= top.floor)) pending &= ~(1u << j);
    }
  }
}

// One warp per row, 32 packs (512 contiguous bytes) per step; the warp's
// list is the row's K best. (Eight warps per row, merged at the end, are
// slower: each warp's list fills and rises on its own, so a row pays
// eight lists' insertions.) kUnroll packs per lane are loaded before any
// is offered; with kScalesFirst their column scales are loaded with them
// rather than as each pack is offered. (bench/results/2026-12-07-rejected-experiments.md times the choices.)
template <int kUnroll, bool kScalesFirst>
__global__ void __launch_bounds__(kThreads)
    TopCandidatesKernel(const __nv_bfloat16* __restrict__ scores, int64_t rows, int64_t stride, int64_t cols,
                        const float* __restrict__ col_scale, int32_t* __restrict__ cand) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps only
  const auto* row = reinterpret_cast<const Bf16x8*>(scores + r * stride);
  const int64_t packs = cols / kVec;
  WarpTopK top;
  // Loop bounds are warp-uniform (the warp's first pack, p - lane):
  // ballots need the whole warp.
  int64_t p = lane;
  for (; p - lane + kUnroll * 32 <= packs; p += kUnroll * 32) {
    Bf16x8 v[kUnroll];
    Scales8 sc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      v[u] = row[p + u * 32];
      if (kScalesFirst) sc[u] = LoadScales(col_scale, p + u * 32, true);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      OfferPack(v[u], kScalesFirst ? sc[u] : LoadScales(col_scale, p + u * 32, true), p + u * 32, lane, true, top);
    }
  }
  for (; p - lane < packs; p += 32) {
    const bool live = p < packs;
    Bf16x8 v = {};
    if (live) v = row[p];
    OfferPack(v, LoadScales(col_scale, p, live), p, lane, live, top);
  }
  if (lane < K) cand[r * K + lane] = top.entry == 0 ? -1 : ArgmaxFromKey(top.entry);
}

// The teacher's choice of TopCandidatesKernel's loads: two packs per lane,
// with their scales: faster than four packs with the scales read as each
// pack is offered (bench/results/2026-12-07-rejected-experiments.md); eight packs need 150 registers and
// run slower still. The candidates are the same.
constexpr int kTopUnroll = 2;
constexpr bool kTopScalesFirst = true;

// The key of column c's exact logit for this row, in every lane of the warp.
__device__ __forceinline__ unsigned long long ExactKey(const Bf16x8* __restrict__ xr,
                                                       const __nv_bfloat16* __restrict__ w, int64_t w_stride,
                                                       int64_t packs, int64_t c, int lane) {
  const auto* wr = reinterpret_cast<const Bf16x8*>(w + c * w_stride);
  float acc = 0.f;
  for (int64_t p = lane; p < packs; p += 32) {
    const Bf16x8 a = xr[p], b = wr[p];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 fa = __bfloat1622float2(a.v[j]), fb = __bfloat1622float2(b.v[j]);
      acc = fmaf(fa.x, fb.x, acc);
      acc = fmaf(fa.y, fb.y, acc);
    }
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  // The logit as a bf16 tensor would hold it.
  return ArgmaxKey(__bfloat162float(__float2bfloat16_rn(acc)), static_cast<uint32_t>(c));
}

__global__ void __launch_bounds__(kThreads)
    RescoreKernel(const __nv_bfloat16* __restrict__ x, int64_t x_stride, const __nv_bfloat16* __restrict__ w,
                  int64_t w_stride, int64_t vocab, int64_t k, const int32_t* __restrict__ cand,
                  const uint8_t* __restrict__ nonfinite, int32_t* __restrict__ out, float* __restrict__ best_logit) {
  __shared__ unsigned long long smem[32];
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = kThreads / 32;
  const auto* xr = reinterpret_cast<const Bf16x8*>(x + r * x_stride);
  const int64_t packs = k / kVec;
  unsigned long long best = 0;
  if (nonfinite[r] != 0) {
    for (int64_t c = warp; c < vocab; c += warps) {
      const unsigned long long key = ExactKey(xr, w, w_stride, packs, c, lane);
      best = key > best ? key : best;
    }
  } else {
    const int32_t c = cand[r * K + warp];
    if (c >= 0) best = ExactKey(xr, w, w_stride, packs, c, lane);
  }
  best = BlockMax(best, smem);
  if (threadIdx.x == 0) {
    out[r] = best == 0 ? 0 : ArgmaxFromKey(best);
    if (best_logit != nullptr) best_logit[r] = ArgmaxValueFromKey(best);
  }
}

}  // namespace

bool QuantizeRowsE4m3(const void* x, int64_t x_stride, int64_t rows, int64_t cols, void* q, float* scale,
                      uint8_t* nonfinite, void* stream) {
  if (rows <= 0 || cols <= 0 || cols % kVec != 0 || x_stride % kVec != 0 || !Aligned16(x) ||
      !Aligned16(q)) {
    return false;
  }
  QuantizeRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), x_stride, cols, static_cast<uint8_t*>(q), scale, nonfinite);
  return true;
}

bool TopScoreCandidates(const void* scores, int64_t rows, int64_t cols, int64_t stride, const float* col_scale,
                        int32_t* cand, void* stream) {
  if (rows <= 0 || cols <= 0 || cols % kVec != 0 || stride % kVec != 0 || !Aligned16(scores) ||
      (col_scale != nullptr && !Aligned16(col_scale))) {
    return false;
  }
  constexpr int64_t kRowsPerBlock = kThreads / 32;
  const auto blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  TopCandidatesKernel<kTopUnroll, kTopScalesFirst><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(scores), rows, stride, cols, col_scale, cand);
  return true;
}

bool RescoreCandidates(const void* x, int64_t x_stride, const void* w, int64_t w_stride, int64_t rows, int64_t vocab,
                       int64_t k, const int32_t* cand, const uint8_t* nonfinite, int32_t* out, float* best_logit,
                       void* stream) {
  if (rows <= 0 || vocab <= 0 || k <= 0 || k % kVec != 0 || x_stride % kVec != 0 || w_stride % kVec != 0 ||
      !Aligned16(x) || !Aligned16(w)) {
    return false;
  }
  RescoreKernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), x_stride, static_cast<const __nv_bfloat16*>(w), w_stride, vocab, k, cand,
      nonfinite, out, best_logit);
  return true;
}

}  // namespace e3::kernels
