// See fused_kernels.h. Memory-bound kernels: 16-byte accesses (8 bf16/fp16
// elements) where the shape allows, fp32 arithmetic, and a rounding to the
// storage dtype exactly where the reference op sequence stores a tensor.
#include "teacher_server/kernels/fused_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

#include "teacher_server/kernels/argmax_key.h"
#include "teacher_server/kernels/packs16.cuh"

namespace e3::kernels {
namespace {

template <typename T>
struct Num;
template <>
struct Num<__nv_bfloat16> {
  static constexpr bool kIsBf16 = true;
  static __device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 FromF(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ uint16_t Bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
  static __device__ __forceinline__ __nv_bfloat16 FromBits(uint16_t b) { return __ushort_as_bfloat16(b); }
};
template <>
struct Num<__half> {
  static constexpr bool kIsBf16 = false;
  static __device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half FromF(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ uint16_t Bits(__half x) { return __half_as_ushort(x); }
  static __device__ __forceinline__ __half FromBits(uint16_t b) { return __ushort_as_half(b); }
};

// The value a tensor of dtype T would hold after storing x.
template <typename T>
__device__ __forceinline__ float Round(float x) {
  return Num<T>::ToF(Num<T>::FromF(x));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

constexpr int kVec = kPack16Elems;
constexpr int kThreads = 256;

// A grid-stride loop's first index for this thread and its step: the
// element-wise kernels cover any size with a capped grid (Blocks()).
template <typename Index = int64_t>
__device__ __forceinline__ Index GridStrideStart() {
  return static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
}
template <typename Index = int64_t>
__device__ __forceinline__ Index GridStride() {
  return static_cast<Index>(gridDim.x) * blockDim.x;
}

// Index arithmetic of the hottest element-wise kernels (SiLU-mul, rope):
// 32-bit where every offset fits, which is fewer instructions per pack
// and, for SiLU-mul, few enough registers for a full SM of threads (8
// blocks of 256; 64-bit indices take 35 registers, which leaves 7). Both
// kernels run faster with 32-bit indices (bench/README.md), with the same
// output bits. (Rope capped at 32 registers spills.)
constexpr int kFullSmBlocks = 8;
template <typename Index>
constexpr int SiluMulMinBlocks() {
  return sizeof(Index) == 4 ? kFullSmBlocks : 1;
}
bool FitsUint32(int64_t elements) { return elements >= 0 && elements <= int64_t{0xffffffff}; }

// Optional operands (nullptr) do not stop the vectorised path.
bool Aligned(const void* p) { return p == nullptr || Is16ByteAligned(p); }

int64_t Blocks(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return b < 1 ? 1 : (b > 65536 ? 65536 : b);
}

// The sum over the block, returned to every thread (blockDim.x a multiple of 32).
__device__ float BlockSum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One block per row; each thread keeps up to kMaxPacks packs of the row
// in registers between the statistics and the scaling.
constexpr int kMaxPacks = 4;
// Packs each thread takes where the row is wide enough: a thread issues
// all of its loads before the block's reduction, so more packs per thread
// keep more bytes in flight: four packs per thread bring the norm close
// to memory bandwidth, fewer leave it short (bench/README.md, kernels).
#ifndef E3_NORM_PACKS_PER_THREAD
#define E3_NORM_PACKS_PER_THREAD 4
#endif
constexpr int kNormPacksPerThread = E3_NORM_PACKS_PER_THREAD;

template <typename T>
__global__ void __launch_bounds__(1024) AddRmsNormKernel(const T* __restrict__ residual, const T* __restrict__ delta,
                                 const T* __restrict__ weight, T* __restrict__ sum, T* __restrict__ out, int64_t cols,
                                 float inv_cols, float eps) {
  using P = Pack<T, kVec>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  const int packs = static_cast<int>(cols / kVec);
  const P* r = reinterpret_cast<const P*>(residual + base);
  const P* d = delta != nullptr ? reinterpret_cast<const P*>(delta + base) : nullptr;
  P h[kMaxPacks];
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPacks; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < packs) {
      P a = r[p];
      if (d != nullptr) {
        const P b = d[p];
#pragma unroll
        for (int i = 0; i < kVec; ++i) a.v[i] = Num<T>::FromF(Num<T>::ToF(a.v[i]) + Num<T>::ToF(b.v[i]));
        reinterpret_cast<P*>(sum + base)[p] = a;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float f = Num<T>::ToF(a.v[i]);
        sq += f * f;
      }
      h[k] = a;
    }
  }
  // mean() multiplies the sum by 1/n, as ATen's mean reduction does.
  const float inv_rms = rsqrtf(BlockSum(sq) * inv_cols + eps);
  const P* w = reinterpret_cast<const P*>(weight);
  P* o = reinterpret_cast<P*>(out + base);
#pragma unroll
  for (int k = 0; k < kMaxPacks; ++k) {
    const int p = threadIdx.x + k * blockDim.x;
    if (p < packs) {
      const P wk = w[p];
      P y;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float normed = Round<T>(Num<T>::ToF(h[k].v[i]) * inv_rms);
        y.v[i] = Num<T>::FromF(Num<T>::ToF(wk.v[i]) * normed);
      }
      o[p] = y;
    }
  }
}

// The rows a kernel with a device-side row limit processes: the first
// *limit (when it is given and smaller), read once per thread.
__device__ __forceinline__ int64_t LimitedRows(int64_t rows, const int32_t* limit) {
  if (limit == nullptr) return rows;
  const int64_t n = *limit;
  return n < rows ? (n < 0 ? 0 : n) : rows;
}

// silu(x) as at::silu stores it in T: x / (1 + exp(-x)) in fp32 (CUDA's
// accurate expf, IEEE division), rounded once.
template <typename T>
__device__ __forceinline__ float SiluExact(float x) {
  return Round<T>(x / (1.f + expf(-x)));
}

// The same bits, faster where no table is available. For bf16 the
// quotient comes first from __fdividef, x times an approximate
// reciprocal, within 2 ulps of the exact quotient for divisors below
// 2^126 (CUDA C++ Programming Guide, intrinsic functions); it is kept
// unless it lies within 16 ulps of a bf16 rounding midpoint (low 16 bits
// near 0x8000), where the exact quotient could round the other way, or
// |x| is outside (1e-30, 80) (divisors past 2^126, tiny quotients, NaN and
// infinities). Those take the IEEE division, so the stored bits are the
// exact formula's for every bf16 input (SglKernelsGpuTest checks all
// 65536). fp16 rounds at another bit, so it keeps the IEEE division
// throughout.
template <typename T>
__device__ __forceinline__ float SiluStored(float x) {
  if (Num<T>::kIsBf16) {
    const float a = fabsf(x);
    const float q = __fdividef(x, 1.f + expf(-x));
    // Unsigned wrap-around: false when the low half is within 16 of 0x8000.
    const bool clear_of_midpoint = (__float_as_uint(q) & 0xffffu) + 16u - 0x8000u > 32u;
    if (a < 80.f && a > 1e-30f && clear_of_midpoint) return Round<T>(q);
  }
  return SiluExact<T>(x);
}

// The grid-stride loop of both SiLU-mul kernels; silu(g) gives a gate's
// stored SiLU as a float. Offsets in packs: gate_up's row holds its gate
// packs, then its up packs; out is contiguous, so pack idx is out's.
template <typename T, typename Index, typename Silu>
__device__ __forceinline__ void SiluMulRows(const T* __restrict__ gate_up, T* __restrict__ out, Index rows,
                                            Index cols, const int32_t* __restrict__ row_limit, Silu silu) {
  using P = Pack<T, kVec>;
  const Index packs = cols / kVec;
  const Index total = static_cast<Index>(LimitedRows(rows, row_limit)) * packs;
  const P* in = reinterpret_cast<const P*>(gate_up);
  P* o = reinterpret_cast<P*>(out);
  for (Index idx = GridStrideStart<Index>(); idx < total; idx += GridStride<Index>()) {
    const Index row = idx / packs, p = idx - row * packs;
    const P g = in[row * 2 * packs + p];
    const P u = in[row * 2 * packs + packs + p];
    P y;
#pragma unroll
    for (int i = 0; i < kVec; ++i) y.v[i] = Num<T>::FromF(silu(g.v[i]) * Num<T>::ToF(u.v[i]));
    o[idx] = y;
  }
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads, SiluMulMinBlocks<Index>())
    SiluMulKernel(const T* __restrict__ gate_up, T* __restrict__ out, Index rows, Index cols,
                  const int32_t* __restrict__ row_limit) {
  SiluMulRows(gate_up, out, rows, cols, row_limit, [](T g) { return SiluStored<T>(Num<T>::ToF(g)); });
}

// SiLU by table. A gate is one of 65536 bit patterns, so the SiLU it
// stores is a table of 65536 values of T (128 KiB), built once per device
// with the exact formula: each block copies it into shared memory, and one
// shared-memory load per element replaces expf, the division and the
// midpoint check. The table fills most of an SM's shared memory, so one
// block of 1024 threads per SM (half the threads the arithmetic kernel
// runs), each with one pack in flight: more packs per thread run slower.
// It runs close to a plain pass without SiLU and well ahead of the
// arithmetic kernel (bench/README.md), same bits. The product stays in
// fp32 and rounds once, as the arithmetic kernel's does.
constexpr int kSiluTableEntries = 1 << 16;
constexpr int kSiluTableBytes = kSiluTableEntries * 2;
constexpr int kSiluTableThreads = 1024;
constexpr int kMaxDevices = 64;

// [0]: bf16, [1]: fp16. A __device__ array has one copy per device.
__device__ uint16_t g_silu_table[2][kSiluTableEntries];

template <typename T>
__device__ __forceinline__ uint16_t* SiluTableOf() {
  return g_silu_table[Num<T>::kIsBf16 ? 0 : 1];
}

template <typename T>
__global__ void BuildSiluTableKernel() {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kSiluTableEntries) {
    SiluTableOf<T>()[i] = Num<T>::Bits(Num<T>::FromF(SiluExact<T>(Num<T>::ToF(Num<T>::FromBits(i)))));
  }
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kSiluTableThreads, 1)
    SiluMulTableKernel(const T* __restrict__ gate_up, T* __restrict__ out, Index rows, Index cols,
                       const int32_t* __restrict__ row_limit) {
  extern __shared__ uint4 table_packs[];
  const uint4* src = reinterpret_cast<const uint4*>(SiluTableOf<T>());
  for (int i = threadIdx.x; i < kSiluTableBytes / 16; i += blockDim.x) table_packs[i] = src[i];
  __syncthreads();
  const uint16_t* table = reinterpret_cast<const uint16_t*>(table_packs);
  SiluMulRows(gate_up, out, rows, cols, row_limit,
              [table](T g) { return Num<T>::ToF(Num<T>::FromBits(table[Num<T>::Bits(g)])); });
}

// out[r] = x[index[r]] for the first LimitedRows rows, a pack per thread.
template <typename T>
__global__ void GatherRowsKernel(const T* __restrict__ x, const int64_t* __restrict__ index, T* __restrict__ out,
                                 int64_t rows, int64_t cols, const int32_t* __restrict__ row_limit) {
  using P = Pack<T, kVec>;
  const int64_t packs = cols / kVec;
  const int64_t total = LimitedRows(rows, row_limit) * packs;
  for (int64_t idx = GridStrideStart(); idx < total; idx += GridStride()) {
    const int64_t r = idx / packs, p = idx % packs;
    reinterpret_cast<P*>(out + r * cols)[p] = reinterpret_cast<const P*>(x + index[r] * cols)[p];
  }
}

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
  const float lim = Round<T>(limit);  // ATen's clamp converts its bound to the dtype
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
        gv = Round<T>(gv + Num<T>::ToF(bg.v[i]));
        uv = Round<T>(uv + Num<T>::ToF(bu.v[i]));
      }
      if (!isnan(gv)) gv = fminf(gv, lim);
      if (!isnan(uv)) uv = fminf(fmaxf(uv, -lim), lim);
      const float scaled = Round<T>(gv * alpha);
      const float sig = Round<T>(1.f / (1.f + expf(-scaled)));
      const float glu = Round<T>(gv * sig);
      const float up1 = Round<T>(uv + 1.f);
      y.v[i] = Num<T>::FromF(up1 * glu);
    }
    o[idx] = y;
  }
}

// A router weight as a float: a 16-bit one widened, an fp32 one as it is.
template <typename T>
__device__ __forceinline__ float WeightToF(T w) {
  return Num<T>::ToF(w);
}
template <>
__device__ __forceinline__ float WeightToF<float>(float w) {
  return w;
}

// One pack of 8 features of one token per thread: the token's k weighted
// expert outputs added in slot order, rounded after every product and add.
// W: the weights' type (T, or float for DeepSeekMoE's fp32 weights).
template <typename T, typename W>
__global__ void MoeCombineKernel(const T* __restrict__ y, const int64_t* __restrict__ rows,
                                 const W* __restrict__ weights, const uint8_t* __restrict__ valid, T* __restrict__ out,
                                 int64_t tokens, int64_t k, int64_t cols) {
  using P = Pack<T, kVec>;
  const int64_t packs = cols / kVec;
  const int64_t total = tokens * packs;
  for (int64_t idx = GridStrideStart(); idx < total; idx += GridStride()) {
    const int64_t t = idx / packs, p = idx % packs;
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
    for (int64_t r = 0; r < k; ++r) {
      const int64_t slot = t * k + r;
      if (valid != nullptr && valid[slot] == 0) continue;
      const P v = reinterpret_cast<const P*>(y + rows[slot] * cols)[p];
      const float w = WeightToF(weights[slot]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = Round<T>(acc[i] + Round<T>(Num<T>::ToF(v.v[i]) * w));
    }
    P o;
#pragma unroll
    for (int i = 0; i < kVec; ++i) o.v[i] = Num<T>::FromF(acc[i]);
    reinterpret_cast<P*>(out + t * cols)[p] = o;
  }
}

// Thread work: N consecutive features i of the first half and the N
// features i + half they rotate with.
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
      y1.v[k] = Num<T>::FromF(Round<T>(a * Num<T>::ToF(c1.v[k])) + Round<T>(-b * Num<T>::ToF(s1.v[k])));
      y2.v[k] = Num<T>::FromF(Round<T>(b * Num<T>::ToF(c2.v[k])) + Round<T>(a * Num<T>::ToF(s2.v[k])));
    }
    *reinterpret_cast<P*>(p + i) = y1;
    *reinterpret_cast<P*>(p + i + half) = y2;
  }
}

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
    const float normed = active ? Round<T>(Num<T>::ToF(v.v[i]) * inv_rms) : 0.f;
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
        y.v[i] = Num<T>::FromF(Round<T>(Num<T>::ToF(y.v[i]) * Num<T>::ToF(c.v[i])) +
                               Round<T>(sign * Num<T>::ToF(u.v[i]) * Num<T>::ToF(s.v[i])));
      }
    }
  }
  if (active) reinterpret_cast<P*>(p)[lane] = y;
}

// The warp's best (value, index) pair in at::argmax's order (ArgmaxPrefers,
// argmax_key.h: a total order, so any reduction tree gives at::argmax's
// answer), left in every lane.
__device__ __forceinline__ void WarpArgBest(float& best, int32_t& best_i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ArgmaxPrefers(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
}

constexpr int kArgmaxThreads = 512;

// One block per row; each thread scans a strided share of the row, four
// 16-byte loads in flight, then the block reduces (value, index) pairs.
template <typename T, bool kVectorised>
__global__ void __launch_bounds__(kArgmaxThreads)
    RowArgmaxKernel(const T* __restrict__ x, int64_t cols, int64_t row_stride, int32_t* __restrict__ out) {
  const T* row = x + static_cast<int64_t>(blockIdx.x) * row_stride;
  float best = -INFINITY;
  int32_t best_i = 0x7fffffff;
  auto consider = [&](float v, int64_t i) {
    if (ArgmaxPrefers(v, static_cast<int32_t>(i), best, best_i)) {
      best = v;
      best_i = static_cast<int32_t>(i);
    }
  };
  if (kVectorised) {
    using P = Pack<T, kVec>;
    constexpr int kUnroll = 4;
    const P* packs = reinterpret_cast<const P*>(row);
    const int64_t n = cols / kVec, stride = blockDim.x;
    int64_t p = threadIdx.x;
    for (; p + (kUnroll - 1) * stride < n; p += kUnroll * stride) {
      P v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = packs[p + u * stride];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) consider(Num<T>::ToF(v[u].v[i]), (p + u * stride) * kVec + i);
      }
    }
    for (; p < n; p += stride) {
      const P v = packs[p];
#pragma unroll
      for (int i = 0; i < kVec; ++i) consider(Num<T>::ToF(v.v[i]), p * kVec + i);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) consider(Num<T>::ToF(row[c]), c);
  }
  WarpArgBest(best, best_i);
  __shared__ float warp_best[32];
  __shared__ int32_t warp_index[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_index[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x >> 5);
    best = lane < warps ? warp_best[lane] : -INFINITY;
    best_i = lane < warps ? warp_index[lane] : 0x7fffffff;
    WarpArgBest(best, best_i);
    if (lane == 0) out[blockIdx.x] = best_i;
  }
}

template <typename T>
void LaunchRowArgmax(const void* x, int64_t rows, int64_t cols, int64_t row_stride, int32_t* out, bool vectorised,
                     cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  const auto blocks = static_cast<unsigned>(rows);
  if (vectorised) {
    RowArgmaxKernel<T, true><<<blocks, kArgmaxThreads, 0, stream>>>(xt, cols, row_stride, out);
  } else {
    RowArgmaxKernel<T, false><<<blocks, kArgmaxThreads, 0, stream>>>(xt, cols, row_stride, out);
  }
}

template <typename T>
void LaunchAddRmsNorm(const void* residual, const void* delta, const void* weight, void* sum, void* out, int64_t rows,
                      int64_t cols, float eps, int threads, cudaStream_t stream) {
  AddRmsNormKernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      static_cast<const T*>(residual), static_cast<const T*>(delta), static_cast<const T*>(weight),
      static_cast<T*>(sum), static_cast<T*>(out), cols, 1.f / static_cast<float>(cols), eps);
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
    RopeKernel<T, kVec, Index><<<Blocks(tokens * heads * half / kVec), kThreads, 0, stream>>>(
        xt, n(tokens), n(heads), n(row_stride), n(head_stride), n(rotary_dim), c, s);
  } else {
    RopeKernel<T, 1, Index><<<Blocks(tokens * heads * half), kThreads, 0, stream>>>(
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

bool AddRmsNorm(Dtype dtype, const void* residual, const void* delta, const void* weight, void* sum, void* out,
                int64_t rows, int64_t cols, float eps, void* stream) {
  if (rows <= 0 || rows > 0x7fffffff || cols % kVec != 0) return false;
  if (!Aligned(residual) || !Aligned(delta) || !Aligned(weight) || !Aligned(sum) || !Aligned(out)) return false;
  const int64_t packs = cols / kVec;
  int64_t threads = ((packs + kNormPacksPerThread - 1) / kNormPacksPerThread + 31) / 32 * 32;
  if (threads > 1024) threads = 1024;
  if (packs > threads * kMaxPacks) return false;
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == Dtype::kBFloat16) {
    LaunchAddRmsNorm<__nv_bfloat16>(residual, delta, weight, sum, out, rows, cols, eps, static_cast<int>(threads), s);
  } else {
    LaunchAddRmsNorm<__half>(residual, delta, weight, sum, out, rows, cols, eps, static_cast<int>(threads), s);
  }
  return true;
}

namespace {

// Per device: the SM count that sizes the table kernels' grid once the
// SiLU tables are built there, kNoSiluTables where they cannot be, 0
// before the device's first SiLU-mul.
constexpr int kNoSiluTables = -1;
struct SiluTables {
  std::atomic<int> sms[kMaxDevices] = {};
  std::mutex build;
};
SiluTables& Tables() {
  static SiluTables tables;
  return tables;
}
std::atomic<bool> g_silu_by_table{true};

template <typename T>
bool PrepareSiluTable(cudaStream_t stream) {
  constexpr int kBuildThreads = 256;
  return cudaFuncSetAttribute(SiluMulTableKernel<T, uint32_t>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSiluTableBytes) == cudaSuccess &&
         cudaFuncSetAttribute(SiluMulTableKernel<T, int64_t>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSiluTableBytes) == cudaSuccess &&
         (BuildSiluTableKernel<T><<<kSiluTableEntries / kBuildThreads, kBuildThreads, 0, stream>>>(),
          cudaGetLastError() == cudaSuccess);
}

// The current device's SM count when SiLU-mul may use the tables there,
// else 0. The first call per device builds them (both dtypes) on `stream`
// and waits for them; it declines while `stream` is capturing a graph, so
// a captured forward whose tables are not built yet computes SiLU (the
// same bits) and a later eager call builds them.
int SiluTableSms(cudaStream_t stream) {
  if (!g_silu_by_table.load(std::memory_order_relaxed)) return 0;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return 0;
  }
  SiluTables& t = Tables();
  int sms = t.sms[device].load(std::memory_order_acquire);
  if (sms == 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return 0;
    }
    const std::lock_guard<std::mutex> lock(t.build);
    sms = t.sms[device].load(std::memory_order_acquire);
    if (sms == 0) {
      int optin = 0, count = 0;
      const bool ok =
          cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
          optin >= kSiluTableBytes &&
          cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && count > 0 &&
          PrepareSiluTable<__nv_bfloat16>(stream) && PrepareSiluTable<__half>(stream) &&
          cudaStreamSynchronize(stream) == cudaSuccess;
      if (!ok) cudaGetLastError();  // the arithmetic kernel's launch check must not see this
      sms = ok ? count : kNoSiluTables;
      t.sms[device].store(sms, std::memory_order_release);
    }
  }
  return sms > 0 ? sms : 0;
}

template <typename T, typename Index>
void LaunchSiluMul(const void* gate_up, void* out, int64_t rows, int64_t cols, const int32_t* row_limit,
                   cudaStream_t stream) {
  const auto* in = static_cast<const T*>(gate_up);
  auto* o = static_cast<T*>(out);
  const int64_t packs = rows * cols / kVec;
  if (const int sms = SiluTableSms(stream); sms > 0) {
    const int64_t wanted = (packs + kSiluTableThreads - 1) / kSiluTableThreads;
    const int blocks = static_cast<int>(wanted < sms ? wanted : sms);
    SiluMulTableKernel<T, Index><<<blocks, kSiluTableThreads, kSiluTableBytes, stream>>>(
        in, o, static_cast<Index>(rows), static_cast<Index>(cols), row_limit);
    return;
  }
  SiluMulKernel<T, Index><<<Blocks(packs), kThreads, 0, stream>>>(in, o, static_cast<Index>(rows),
                                                                  static_cast<Index>(cols), row_limit);
}

template <typename T>
void LaunchSiluMul(const void* gate_up, void* out, int64_t rows, int64_t cols, const int32_t* row_limit,
                   cudaStream_t stream) {
  if (FitsUint32(rows * 2 * cols)) {  // gate_up's elements, the largest offset
    LaunchSiluMul<T, uint32_t>(gate_up, out, rows, cols, row_limit, stream);
  } else {
    LaunchSiluMul<T, int64_t>(gate_up, out, rows, cols, row_limit, stream);
  }
}

}  // namespace

bool SiluMul(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t cols, const int32_t* row_limit,
             void* stream) {
  if (rows <= 0 || cols % kVec != 0 || !Aligned(gate_up) || !Aligned(out)) return false;
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == Dtype::kBFloat16) {
    LaunchSiluMul<__nv_bfloat16>(gate_up, out, rows, cols, row_limit, s);
  } else {
    LaunchSiluMul<__half>(gate_up, out, rows, cols, row_limit, s);
  }
  return true;
}

void SetSiluMulByTable(bool on) { g_silu_by_table.store(on, std::memory_order_relaxed); }

bool SiluMulByTable(void* stream) { return SiluTableSms(static_cast<cudaStream_t>(stream)) > 0; }

bool GatherRows(Dtype dtype, const void* x, const int64_t* index, void* out, int64_t rows, int64_t cols,
                const int32_t* row_limit, void* stream) {
  if (rows <= 0 || cols % kVec != 0 || !Aligned(x) || !Aligned(out)) return false;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = Blocks(rows * cols / kVec);
  if (dtype == Dtype::kBFloat16) {
    GatherRowsKernel<__nv_bfloat16><<<blocks, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), index,
                                                                static_cast<__nv_bfloat16*>(out), rows, cols,
                                                                row_limit);
  } else {
    GatherRowsKernel<__half><<<blocks, kThreads, 0, s>>>(static_cast<const __half*>(x), index,
                                                         static_cast<__half*>(out), rows, cols, row_limit);
  }
  return true;
}

bool RopeInPlace(Dtype dtype, void* x, int64_t tokens, int64_t heads, int64_t row_stride, int64_t head_stride,
                 int64_t rotary_dim, const void* cos, const void* sin, void* stream) {
  if (tokens <= 0 || heads <= 0 || rotary_dim <= 0 || rotary_dim % 2 != 0) return false;
  const int64_t half = rotary_dim / 2;
  const bool vectorised = half % kVec == 0 && row_stride % kVec == 0 && head_stride % kVec == 0 && Aligned(x) &&
                          Aligned(cos) && Aligned(sin);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == Dtype::kBFloat16) {
    LaunchRope<__nv_bfloat16>(x, tokens, heads, row_stride, head_stride, rotary_dim, cos, sin, vectorised, s);
  } else {
    LaunchRope<__half>(x, tokens, heads, row_stride, head_stride, rotary_dim, cos, sin, vectorised, s);
  }
  return true;
}

bool HeadRmsNormRopeInPlace(Dtype dtype, void* x, int64_t tokens, int64_t heads, int64_t row_stride,
                            int64_t head_stride, int64_t head_dim, const void* weight, float eps, int64_t rotary_dim,
                            const void* cos, const void* sin, void* stream) {
  const int64_t lanes = head_dim / kVec;
  if (tokens <= 0 || heads <= 0 || head_dim % kVec != 0 || lanes > 32 || (lanes & (lanes - 1)) != 0) return false;
  if (row_stride % kVec != 0 || head_stride % kVec != 0 || !Aligned(x) || !Aligned(weight)) return false;
  // Rotation halves of whole packs, within the head.
  if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % (2 * kVec) != 0) return false;
  if (rotary_dim > 0 && (cos == nullptr || sin == nullptr || !Aligned(cos) || !Aligned(sin))) return false;
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

bool RowArgmax(Dtype dtype, const void* x, int64_t rows, int64_t cols, int64_t row_stride, int32_t* out,
               void* stream) {
  if (rows <= 0 || rows > 0x7fffffff || cols <= 0 || cols > 0x7fffffff || row_stride < cols) return false;
  const bool vectorised = cols % kVec == 0 && row_stride % kVec == 0 && Aligned(x);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == Dtype::kBFloat16) {
    LaunchRowArgmax<__nv_bfloat16>(x, rows, cols, row_stride, out, vectorised, s);
  } else {
    LaunchRowArgmax<__half>(x, rows, cols, row_stride, out, vectorised, s);
  }
  return true;
}

bool ClampedSwiGlu(Dtype dtype, const void* gate_up, const void* bias, const int64_t* row_expert, void* out,
                   int64_t rows, int64_t cols, float alpha, float limit, const int32_t* row_limit, void* stream) {
  if (rows <= 0 || cols % kVec != 0 || !Aligned(gate_up) || !Aligned(bias) || !Aligned(out) ||
      (bias == nullptr) != (row_expert == nullptr)) {
    return false;
  }
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = Blocks(rows * cols / kVec);
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

bool MoeCombine(Dtype dtype, const void* y, const int64_t* rows, const void* weights, bool fp32_weights,
                const uint8_t* valid, void* out, int64_t tokens, int64_t k, int64_t cols, void* stream) {
  if (tokens <= 0 || k <= 0 || cols % kVec != 0 || !Aligned(y) || !Aligned(out)) return false;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t blocks = Blocks(tokens * cols / kVec);
  if (dtype == Dtype::kBFloat16) {
    using T = __nv_bfloat16;
    if (fp32_weights) {
      MoeCombineKernel<T, float><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                             static_cast<const float*>(weights), valid,
                                                             static_cast<T*>(out), tokens, k, cols);
    } else {
      MoeCombineKernel<T, T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                         static_cast<const T*>(weights), valid, static_cast<T*>(out),
                                                         tokens, k, cols);
    }
  } else {
    using T = __half;
    if (fp32_weights) {
      MoeCombineKernel<T, float><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                             static_cast<const float*>(weights), valid,
                                                             static_cast<T*>(out), tokens, k, cols);
    } else {
      MoeCombineKernel<T, T><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(y), rows,
                                                         static_cast<const T*>(weights), valid, static_cast<T*>(out),
                                                         tokens, k, cols);
    }
  }
  return true;
}

const char* TakeLaunchError() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace e3::kernels
