// DFlash block attention, context part, flash-style (see student_ops.h):
// tensor-core tiles (mma.sync m16n8k16, fp32 accumulators) over tiles of
// context rows copied into shared memory by cp.async, double buffered;
// scores and probabilities live in registers only.
//
// Forward and dQ: a CTA per (run of consecutive blocks, key/value head).
// A block's M = g * B query rows (its B rows under each of the g query
// heads that read this key/value head) share one key range, the context
// before the anchor, and consecutive blocks share most of it, so each warp
// takes 16 rows of one block and the CTA walks the union of its blocks'
// ranges in tiles of 64 rows. The forward keeps the online softmax of
// flash attention; the dQ pass recomputes P from the merged log-sum-exp.
//
// dK/dV: a CTA per (tile of 128 context rows, key/value head), each warp
// owning 16 of the keys and accumulating their gradients in registers
// while it walks the blocks whose context covers them (a contiguous run of
// blocks, planned on the host), 64 query rows at a time. No atomics: each
// output element has one writer, so the results are deterministic.
//
// Fragment layouts are PTX's for mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16 x 16): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16 x 8):  b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C (16 x 8):  c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
// so a C tile pair of keys [16k, 16k+16) is the A operand of the next
// product without leaving registers.
#include <cmath>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/student_ops.h"

namespace e3::kernels {
namespace {

constexpr int kKeyTile = 64;    // context rows per tile
constexpr int kQueryTile = 64;  // query rows per step of the dK/dV pass
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
__device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (Num<T>::kIsBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two values rounded to T, the first in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  return static_cast<uint32_t>(Num<T>::Bits(Num<T>::FromF(lo))) |
         (static_cast<uint32_t>(Num<T>::Bits(Num<T>::FromF(hi))) << 16);
}
// Two 16-bit values of consecutive elements (4-byte aligned).
__device__ __forceinline__ uint32_t Load2(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// Two 16-bit values `ld` elements apart (a column pair of a row-major tile).
__device__ __forceinline__ uint32_t Load2Strided(const uint16_t* p, int ld) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[ld]) << 16);
}

// The A fragment of a C tile pair: keys [16k, 16k + 16) of a 16-row strip.
template <typename T>
__device__ __forceinline__ void CPairToA(const float c0[4], const float c1[4], uint32_t a[4]) {
  a[0] = Pack2<T>(c0[0], c0[1]);
  a[1] = Pack2<T>(c0[2], c0[3]);
  a[2] = Pack2<T>(c1[0], c1[1]);
  a[3] = Pack2<T>(c1[2], c1[3]);
}

// Shapes and pointers every kernel reads; 16-bit tensors as their bits.
struct Args {
  const uint16_t *q, *k, *v, *dout;
  const int32_t *ctx_begin, *ctx_end, *tile_first, *tile_end;
  const float *lse_in, *delta;
  float *out, *lse_out, *dq, *dk, *dv;
  int block_size, q_heads, kv_heads, group,
      rows_per_block;  // group = q_heads / kv_heads; M = group * B
  int blocks_per_cta;  // forward and dQ: 128 / M (at least 1)
  int64_t num_blocks, context_rows;
  float scale, scale_log2;  // scale and scale * log2(e)
};

// The global offset of local query row m (head-major within the block:
// m = local head * B + i) of block `blk` under key/value head h.
__device__ __forceinline__ int64_t QueryRowOffset(const Args& a, int64_t blk, int h, int m, int D) {
  const int64_t row = blk * a.block_size + m % a.block_size;
  const int head = h * a.group + m / a.block_size;
  return (row * a.q_heads + head) * D;
}

// 16 bytes global -> shared without passing through registers; with
// `valid` false the 16 bytes are zero (nothing is read).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts copying `rows` rows of one key/value head of x ([*, Hkv, D]) from
// row `first` into a shared tile with row stride D + 8 (conflict-free
// fragment loads); rows at or past `valid` become zeros, so no stale value
// meets a zero probability.
template <int D>
__device__ __forceinline__ void AsyncKeyRows(uint16_t* tile, int rows, const uint16_t* x,
                                             const Args& a, int h, int64_t first, int64_t valid) {
  constexpr int kChunks = D / kVec, kLd = D + 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = (i % kChunks) * kVec;
    const bool ok = first + r < valid;
    CpAsync16(tile + r * kLd + c, ok ? x + ((first + r) * a.kv_heads + h) * D + c : x, ok);
  }
}

// The 16 x 16 A fragments of a 16-row strip whose rows start at `lo` and
// `hi` (rows g and g + 8), over the full head dimension: D / 16 of them.
template <int D>
__device__ __forceinline__ void LoadRowFragments(const uint16_t* lo, const uint16_t* hi,
                                                 uint32_t a[D / 16][4]) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    a[ks][0] = Load2(lo + ks * 16 + 2 * t);
    a[ks][1] = Load2(hi + ks * 16 + 2 * t);
    a[ks][2] = Load2(lo + ks * 16 + 8 + 2 * t);
    a[ks][3] = Load2(hi + ks * 16 + 8 + 2 * t);
  }
}

// s[n] (+)= A x tile^T over 64 tile rows: s is [16 rows, 64 keys] as 8 C
// tiles; the B operand is the tile's rows (row-major, contiguous pairs).
template <typename T, int D>
__device__ __forceinline__ void RowsTimesTileT(const uint32_t a[D / 16][4], const uint16_t* tile,
                                               float s[8][4]) {
  constexpr int kLd = D + 8;
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const uint16_t* p = tile + (n * 8 + g) * kLd + ks * 16 + 2 * t;
      Mma<T>(s[n], a[ks], Load2(p), Load2(p + 8));
    }
  }
}

// The same with the A strip read from shared memory step by step (rows
// `lo` and `hi` of a tile): fewer registers where the accumulators are many.
template <typename T, int D>
__device__ __forceinline__ void SharedRowsTimesTileT(const uint16_t* lo, const uint16_t* hi,
                                                     const uint16_t* tile, float s[8][4]) {
  constexpr int kLd = D + 8;
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint32_t a[4] = {Load2(lo + ks * 16 + 2 * t), Load2(hi + ks * 16 + 2 * t),
                           Load2(lo + ks * 16 + 8 + 2 * t), Load2(hi + ks * 16 + 8 + 2 * t)};
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const uint16_t* p = tile + (n * 8 + g) * kLd + ks * 16 + 2 * t;
      Mma<T>(s[n], a, Load2(p), Load2(p + 8));
    }
  }
}

// acc[n] += P x tile: P [16 rows, 64 tile rows] as 8 C tiles (rounded to
// T), tile [64, D] row-major; acc is [16, D] as D / 8 C tiles.
template <typename T, int D>
__device__ __forceinline__ void ProbsTimesTile(const float p[8][4], const uint16_t* tile,
                                               float acc[D / 8][4]) {
  constexpr int kLd = D + 8;
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t pa[4];
    CPairToA<T>(p[2 * kk], p[2 * kk + 1], pa);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const uint16_t* col = tile + (kk * 16 + 2 * t) * kLd + n * 8 + g;
      Mma<T>(acc[n], pa, Load2Strided(col, kLd), Load2Strided(col + 8 * kLd, kLd));
    }
  }
}

// The sum over the four lanes that share a fragment row.
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// The query side of the forward and dQ kernels: a CTA takes
// `blocks_per_cta` consecutive blocks (consecutive anchors of one sample
// share most of their context, so each key tile is read once for all of
// them), each warp 16 query rows of one block, and the CTA walks the union
// of its blocks' key ranges in double-buffered tiles of 64 rows.
struct QueryWarp {
  int64_t blk = 0, cb = 0, ce = 0;  // this warp's block and its context range
  bool has_context = false;
  int64_t off[2] = {0, 0};                 // rows g and g + 8: offsets into q / dout / out
  int64_t range_begin = 0, range_end = 0;  // the CTA's key range
};
template <int D>
__device__ __forceinline__ QueryWarp MakeQueryWarp(const Args& a) {
  QueryWarp w;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, M = a.rows_per_block;
  const int64_t first_blk = static_cast<int64_t>(blockIdx.x) * a.blocks_per_cta;
  w.range_begin = INT64_MAX;
  for (int i = 0; i < a.blocks_per_cta && first_blk + i < a.num_blocks; ++i) {
    const int64_t b = a.ctx_begin[first_blk + i], e = a.ctx_end[first_blk + i];
    if (e > b) {
      w.range_begin = min(w.range_begin, b);
      w.range_end = max(w.range_end, e);
    }
  }
  w.blk = first_blk + warp * 16 / M;
  if (w.blk < a.num_blocks) {
    w.cb = a.ctx_begin[w.blk];
    w.ce = a.ctx_end[w.blk];
    w.has_context = w.ce > w.cb;
  }
  const int m = warp * 16 % M + g;
  const int64_t blk = w.has_context ? w.blk : 0;
  w.off[0] = QueryRowOffset(a, blk, blockIdx.y, m, D);
  w.off[1] = QueryRowOffset(a, blk, blockIdx.y, m + 8, D);
  return w;
}

// Starts tile `it` of the CTA's range into stage it % 2 (K and V rows).
template <int D>
__device__ __forceinline__ void AsyncContextTile(uint16_t* smem, const Args& a, const QueryWarp& w,
                                                 int it, bool with_v) {
  constexpr int kTile = kKeyTile * (D + 8);
  uint16_t* stage = smem + (it & 1) * 2 * kTile;
  const int64_t first = w.range_begin + static_cast<int64_t>(it) * kKeyTile;
  AsyncKeyRows<D>(stage, kKeyTile, a.k, a, blockIdx.y, first, w.range_end);
  if (with_v) AsyncKeyRows<D>(stage + kTile, kKeyTile, a.v, a, blockIdx.y, first, w.range_end);
  CpAsyncCommit();
}

template <int D>
constexpr int QuerySideSharedBytes() {
  return 2 * 2 * kKeyTile * (D + 8) * 2;
}

// Forward: grid (ceil(blocks / blocks_per_cta), kv_heads), blocks_per_cta * M / 16 warps.
template <typename T, int D>
__global__ void __launch_bounds__(256) ContextForwardKernel(Args a) {
  constexpr int kTile = kKeyTile * (D + 8);
  extern __shared__ __align__(16) uint16_t smem[];
  const int t = threadIdx.x & 3;
  const QueryWarp w = MakeQueryWarp<D>(a);
  if (w.range_end <= w.range_begin)
    return;  // no context in the CTA: the caller's zeros and -inf stand
  uint32_t qa[D / 16][4] = {};
  if (w.has_context) LoadRowFragments<D>(a.q + w.off[0], a.q + w.off[1], qa);
  float o[D / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const int tiles = static_cast<int>((w.range_end - w.range_begin + kKeyTile - 1) / kKeyTile);
  AsyncContextTile<D>(smem, a, w, 0, true);
  for (int it = 0; it < tiles; ++it) {
    if (it + 1 < tiles) {
      AsyncContextTile<D>(smem, a, w, it + 1, true);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int64_t first = w.range_begin + static_cast<int64_t>(it) * kKeyTile;
    if (w.has_context && first < w.ce && first + kKeyTile > w.cb) {  // warp-uniform
      const uint16_t* ks = smem + (it & 1) * 2 * kTile;
      float s[8][4] = {};
      RowsTimesTileT<T, D>(qa, ks, s);
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t key = first + n * 8 + 2 * t + (e & 1);
          s[n][e] = key >= w.cb && key < w.ce ? s[n][e] * a.scale_log2 : -INFINITY;
          tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float new_max =
            fmaxf(row_max[r], QuadMax(tile_max[r]));           // finite: the tile meets [cb, ce)
        const float correction = exp2f(row_max[r] - new_max);  // 0 on the first tile
        row_max[r] = new_max;
        row_sum[r] *= correction;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[n][2 * r] *= correction;
          o[n][2 * r + 1] *= correction;
        }
      }
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = exp2f(s[n][e] - row_max[e >> 1]);
          row_sum[e >> 1] += s[n][e];
        }
      }
      ProbsTimesTile<T, D>(s, ks + kTile, o);
    }
    __syncthreads();  // stage it % 2 is refilled next
  }
  if (!w.has_context) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = QuadSum(row_sum[r]);
    const float inv = 1.f / sum;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<float2*>(a.out + w.off[r] + n * 8 + 2 * t) =
          make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (t == 0) a.lse_out[w.off[r] / D] = (row_max[r] + log2f(sum)) / kLog2e;
  }
}

// P = exp(scale * s - lse) where the key is seen (0 elsewhere), and
// dS = P * (dP - delta), both in place; s and dp are [16 rows, 64 keys]
// C tiles whose element (n, e) is key `key(n, e)` of row `row(e)`.
template <typename SeenFn, typename RowFn>
__device__ __forceinline__ void SoftmaxGrad(float s[8][4], float dp[8][4], float scale_log2,
                                            SeenFn seen, RowFn lse2_delta) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float lse2, delta;
      lse2_delta(n, e, &lse2, &delta);
      const float p = seen(n, e) ? exp2f(s[n][e] * scale_log2 - lse2) : 0.f;
      s[n][e] = p;
      dp[n][e] = p * (dp[n][e] - delta);
    }
  }
}

// dQ: the forward's grid and warps; dq += scale * dS K.
template <typename T, int D>
__global__ void __launch_bounds__(256) ContextDqKernel(Args a) {
  constexpr int kTile = kKeyTile * (D + 8);
  extern __shared__ __align__(16) uint16_t smem[];
  const int t = threadIdx.x & 3;
  const QueryWarp w = MakeQueryWarp<D>(a);
  if (w.range_end <= w.range_begin) return;
  uint32_t qa[D / 16][4] = {}, da[D / 16][4] = {};
  float lse2[2] = {0.f, 0.f}, delta[2] = {0.f, 0.f};
  if (w.has_context) {
    LoadRowFragments<D>(a.q + w.off[0], a.q + w.off[1], qa);
    LoadRowFragments<D>(a.dout + w.off[0], a.dout + w.off[1], da);
    for (int r = 0; r < 2; ++r) {
      lse2[r] = a.lse_in[w.off[r] / D] * kLog2e;
      delta[r] = a.delta[w.off[r] / D];
    }
  }
  float dq[D / 8][4] = {};
  const int tiles = static_cast<int>((w.range_end - w.range_begin + kKeyTile - 1) / kKeyTile);
  AsyncContextTile<D>(smem, a, w, 0, true);
  for (int it = 0; it < tiles; ++it) {
    if (it + 1 < tiles) {
      AsyncContextTile<D>(smem, a, w, it + 1, true);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int64_t first = w.range_begin + static_cast<int64_t>(it) * kKeyTile;
    if (w.has_context && first < w.ce && first + kKeyTile > w.cb) {
      const uint16_t* ks = smem + (it & 1) * 2 * kTile;
      float s[8][4] = {}, dp[8][4] = {};
      RowsTimesTileT<T, D>(qa, ks, s);
      RowsTimesTileT<T, D>(da, ks + kTile, dp);
      SoftmaxGrad(
          s, dp, a.scale_log2,
          [&](int n, int e) {
            const int64_t key = first + n * 8 + 2 * t + (e & 1);
            return key >= w.cb && key < w.ce;
          },
          [&](int, int e, float* l, float* d) {
            *l = lse2[e >> 1];
            *d = delta[e >> 1];
          });
      ProbsTimesTile<T, D>(dp, ks, dq);
    }
    __syncthreads();
  }
  if (!w.has_context) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2* p = reinterpret_cast<float2*>(a.dq + w.off[r] + n * 8 + 2 * t);
      const float2 old = *p;
      *p = make_float2(old.x + a.scale * dq[n][2 * r], old.y + a.scale * dq[n][2 * r + 1]);
    }
  }
}

// dK and dV: grid (key tiles of kDFlashBackwardKeyTile rows, kv_heads),
// one warp per 16 keys. The CTA walks the blocks whose context meets its
// keys, 64 query rows (Q and dO) at a time, double-buffered.
constexpr int kDkvWarps = static_cast<int>(kDFlashBackwardKeyTile / 16);

template <int D>
constexpr int DkvSharedBytes() {
  return (kDFlashBackwardKeyTile * 2 + 2 * 2 * kQueryTile) * (D + 8) * 2 + 2 * 2 * kQueryTile * 4;
}

// Whether block b's context meets keys [k0, k0 + rows).
__device__ __forceinline__ bool Meets(const Args& a, int64_t b, int64_t k0, int64_t rows) {
  const int64_t cb = a.ctx_begin[b], ce = a.ctx_end[b];
  return ce > cb && ce > k0 && cb < k0 + rows;
}

template <int D>
struct DkvStage {
  uint16_t *q, *dout;
  float *lse2, *delta;
};
template <int D>
__device__ __forceinline__ DkvStage<D> StageOf(uint16_t* base, int stage) {
  constexpr int kRows = kQueryTile * (D + 8);
  uint16_t* q = base + stage * 2 * kRows;
  float* f = reinterpret_cast<float*>(base + 2 * 2 * kRows) + stage * 2 * kQueryTile;
  return {q, q + kRows, f, f + kQueryTile};
}

// Starts query rows [m0, m0 + 64) of block `blk` (Q and dO; rows past M are
// zeros) into `st`, and writes their log-sum-exp (log2 units) and delta.
template <int D>
__device__ __forceinline__ void AsyncQueryRows(const DkvStage<D>& st, const Args& a, int64_t blk,
                                               int m0) {
  constexpr int kChunks = D / kVec, kLd = D + 8;
  const int M = a.rows_per_block, h = blockIdx.y;
  for (int i = threadIdx.x; i < kQueryTile * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = (i % kChunks) * kVec;
    const bool ok = m0 + r < M;
    const int64_t o = ok ? QueryRowOffset(a, blk, h, m0 + r, D) + c : 0;
    CpAsync16(st.q + r * kLd + c, a.q + o, ok);
    CpAsync16(st.dout + r * kLd + c, a.dout + o, ok);
  }
  CpAsyncCommit();
  for (int r = threadIdx.x; r < kQueryTile; r += blockDim.x) {
    const bool ok = m0 + r < M;
    const int64_t row = ok ? QueryRowOffset(a, blk, h, m0 + r, D) / D : 0;
    st.lse2[r] = ok ? a.lse_in[row] * kLog2e : INFINITY;
    st.delta[r] = ok ? a.delta[row] : 0.f;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kDkvWarps * 32) ContextDkvKernel(Args a) {
  constexpr int kLd = D + 8, kKeys = static_cast<int>(kDFlashBackwardKeyTile);
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* ks = smem;
  uint16_t* vs = ks + kKeys * kLd;
  uint16_t* stages = vs + kKeys * kLd;
  const int h = blockIdx.y, warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2,
            t = threadIdx.x & 3;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kKeys;
  const int64_t blk_end = a.tile_end[blockIdx.x];
  auto next_block = [&](int64_t b) {
    while (b < blk_end && !Meets(a, b, k0, kKeys)) ++b;
    return b;
  };
  int64_t blk = next_block(a.tile_first[blockIdx.x]);
  if (blk >= blk_end) return;  // no block sees these keys: their gradients stay as they are
  AsyncKeyRows<D>(ks, kKeys, a.k, a, h, k0, a.context_rows);
  AsyncKeyRows<D>(vs, kKeys, a.v, a, h, k0, a.context_rows);
  AsyncQueryRows<D>(StageOf<D>(stages, 0), a, blk, 0);  // one commit group with the keys
  const int64_t key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  const int64_t warp_first = k0 + warp * 16;
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int M = a.rows_per_block;
  int m0 = 0, stage = 0;
  while (true) {
    int64_t next_blk = blk;
    int next_m0 = m0 + kQueryTile;
    if (next_m0 >= M) {
      next_m0 = 0;
      next_blk = next_block(blk + 1);
    }
    const bool more = next_blk < blk_end;
    if (more) {
      AsyncQueryRows<D>(StageOf<D>(stages, stage ^ 1), a, next_blk, next_m0);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const int64_t cb = a.ctx_begin[blk], ce = a.ctx_end[blk];
    if (warp_first < ce &&
        warp_first + 16 > cb) {  // warp-uniform: its keys meet the block's context
      const DkvStage<D> st = StageOf<D>(stages, stage);
      const int lo = (warp * 16 + g) * kLd, hi = lo + 8 * kLd;
      float s[8][4] = {}, dp[8][4] = {};
      SharedRowsTimesTileT<T, D>(ks + lo, ks + hi, st.q, s);
      SharedRowsTimesTileT<T, D>(vs + lo, vs + hi, st.dout, dp);
      SoftmaxGrad(
          s, dp, a.scale_log2,
          [&](int n, int e) {
            const int64_t k = key[e >> 1];
            return k >= cb && k < ce && m0 + n * 8 + 2 * t + (e & 1) < M;
          },
          [&](int n, int e, float* l, float* d) {
            const int c = n * 8 + 2 * t + (e & 1);
            *l = st.lse2[c];
            *d = st.delta[c];
          });
      ProbsTimesTile<T, D>(s, st.dout, dv);  // dV += P^T dO
      ProbsTimesTile<T, D>(dp, st.q, dk);    // dK += dS^T Q
    }
    __syncthreads();  // this stage is refilled next
    if (!more) break;
    blk = next_blk;
    m0 = next_m0;
    stage ^= 1;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= a.context_rows) continue;
    const int64_t off = (key[r] * a.kv_heads + h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2* pk = reinterpret_cast<float2*>(a.dk + off + n * 8 + 2 * t);
      float2* pv = reinterpret_cast<float2*>(a.dv + off + n * 8 + 2 * t);
      const float2 ok = *pk, ov = *pv;
      *pk = make_float2(ok.x + a.scale * dk[n][2 * r], ok.y + a.scale * dk[n][2 * r + 1]);
      *pv = make_float2(ov.x + dv[n][2 * r], ov.y + dv[n][2 * r + 1]);
    }
  }
}

Args MakeArgs(const DFlashContextShape& shape, const DFlashContextBlocks& blocks) {
  Args a{};
  a.ctx_begin = blocks.context_begin;
  a.ctx_end = blocks.context_end;
  a.tile_first = blocks.tile_first_block;
  a.tile_end = blocks.tile_end_block;
  a.block_size = static_cast<int>(shape.block_size);
  a.q_heads = static_cast<int>(shape.q_heads);
  a.kv_heads = static_cast<int>(shape.kv_heads);
  a.group = a.q_heads / a.kv_heads;
  a.rows_per_block = a.group * a.block_size;
  a.blocks_per_cta = a.rows_per_block >= 128 ? 1 : 128 / a.rows_per_block;
  a.num_blocks = shape.blocks;
  a.context_rows = shape.context_rows;
  a.scale = shape.scale;
  a.scale_log2 = shape.scale * kLog2e;
  return a;
}

template <typename F>
bool DispatchHeadDim(int64_t head_dim, F&& f) {
  if (head_dim == 64) return f(std::integral_constant<int, 64>{});
  if (head_dim == 128) return f(std::integral_constant<int, 128>{});
  return false;
}

// Lets `kernel` take `bytes` of dynamic shared memory (false: refused).
template <typename Kernel>
bool AllowShared(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) ==
         cudaSuccess;
}

// Launches a query-side kernel (forward or dQ) over every block.
template <typename Kernel>
void LaunchQuerySide(Kernel kernel, int shared_bytes, const Args& a, void* stream) {
  const dim3 grid(static_cast<unsigned>((a.num_blocks + a.blocks_per_cta - 1) / a.blocks_per_cta),
                  static_cast<unsigned>(a.kv_heads));
  kernel<<<grid, a.blocks_per_cta * a.rows_per_block / 16 * 32, shared_bytes, AsStream(stream)>>>(
      a);
}

}  // namespace

bool DFlashContextAttentionTakes(const DFlashContextShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128) return false;
  if (s.kv_heads <= 0 || s.q_heads % s.kv_heads != 0 || s.block_size <= 0) return false;
  const int64_t m = s.q_heads / s.kv_heads * s.block_size;
  return m % 16 == 0 && m <= 128 && s.blocks <= 0x7fffffff && s.key_tiles <= 0x7fffffff &&
         s.kv_heads <= 65535;
}

bool DFlashContextForward(Dtype dtype, const DFlashContextShape& shape,
                          const DFlashContextBlocks& blocks, const void* q, const void* k,
                          const void* v, float* out, float* lse, void* stream) {
  if (!DFlashContextAttentionTakes(shape) || !Aligned16(q) || !Aligned16(k) || !Aligned16(v) ||
      !Aligned16(out)) {
    return false;
  }
  if (shape.blocks == 0) return true;
  Args a = MakeArgs(shape, blocks);
  a.q = static_cast<const uint16_t*>(q);
  a.k = static_cast<const uint16_t*>(k);
  a.v = static_cast<const uint16_t*>(v);
  a.out = out;
  a.lse_out = lse;
  return DispatchDtype(dtype, [&](auto t) {
    using T = decltype(t);
    return DispatchHeadDim(shape.head_dim, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      if (!AllowShared(ContextForwardKernel<T, kD>, QuerySideSharedBytes<kD>())) return false;
      LaunchQuerySide(ContextForwardKernel<T, kD>, QuerySideSharedBytes<kD>(), a, stream);
      return true;
    });
  });
}

bool DFlashContextBackward(Dtype dtype, const DFlashContextShape& shape,
                           const DFlashContextBlocks& blocks, const void* q, const void* k,
                           const void* v, const void* dout, const float* lse, const float* delta,
                           float* dq, float* dk, float* dv, void* stream) {
  if (!DFlashContextAttentionTakes(shape) || !Aligned16(q) || !Aligned16(k) || !Aligned16(v) ||
      !Aligned16(dout) || !Aligned16(dq) || !Aligned16(dk) || !Aligned16(dv)) {
    return false;
  }
  Args a = MakeArgs(shape, blocks);
  a.q = static_cast<const uint16_t*>(q);
  a.k = static_cast<const uint16_t*>(k);
  a.v = static_cast<const uint16_t*>(v);
  a.dout = static_cast<const uint16_t*>(dout);
  a.lse_in = lse;
  a.delta = delta;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  return DispatchDtype(dtype, [&](auto t) {
    using T = decltype(t);
    return DispatchHeadDim(shape.head_dim, [&](auto d) {
      constexpr int kD = decltype(d)::value;
      // Both kernels' shared memory first: a refusal then launches nothing.
      if (!AllowShared(ContextDqKernel<T, kD>, QuerySideSharedBytes<kD>()) ||
          !AllowShared(ContextDkvKernel<T, kD>, DkvSharedBytes<kD>())) {
        return false;
      }
      if (shape.blocks > 0)
        LaunchQuerySide(ContextDqKernel<T, kD>, QuerySideSharedBytes<kD>(), a, stream);
      if (shape.key_tiles > 0) {
        constexpr int kBytes = DkvSharedBytes<kD>();
        const dim3 grid(static_cast<unsigned>(shape.key_tiles),
                        static_cast<unsigned>(shape.kv_heads));
        ContextDkvKernel<T, kD><<<grid, kDkvWarps * 32, kBytes, AsStream(stream)>>>(a);
      }
      return true;
    });
  });
}

}  // namespace e3::kernels
