// The sgl forward's two slowest memory-bound steps, SiLU-mul and rope:
// the teacher's kernels (fused_kernels.cu SiluMul, RopeInPlace) against
// variants, alone and in sequence after the GEMM that feeds each (the
// forward's order, so the clock is the one the power-capped GEMMs leave
// it). Every variant's output is compared with the teacher kernel's bit
// for bit before it is timed; one that differs is reported and not timed.
//
// Why: a Kineto profile of the 8B forward (8x1024, one H200, 2026-12-01,
// bench/README.md section 8) put SiLU-mul at 7.44 ms of 186.9 per
// forward (22.6 GB at 3.0 TB/s, where a device copy moves 4.3) and rope
// at 1.96 ms in 64 launches (5.4 GB at 2.8 TB/s).
// - SiLU-mul: the variants load U packs of gate and of up per thread
//   before computing, with 32-bit indices; the minimum blocks per SM (B,
//   in __launch_bounds__) is the second knob, as registers cap the
//   threads per SM. Measured (bench/README.md section 8, sixteenth
//   session): U=1 B=8 was 1.11x the teacher's kernel of then (64-bit
//   indices, 35 registers) alone on the 8B MLP and every U > 1 slower, so
//   the teacher's kernel is now that form; the probe keeps the variants
//   to retest on other GPUs. Seventeenth session: the arithmetic costs
//   (the same kernel without SiLU ran at 4.31 TB/s against 3.18), and a
//   division by __fdividef with the exact division near bf16 rounding
//   midpoints gave the same bits 1.03-1.08x faster alone, so the
//   teacher's bf16 kernel divides so (U=1 B=8 below is the exact
//   division, checked against it). Eighteenth session: a table of all
//   65536 gates' stored SiLU in shared memory (one block of 1024 threads
//   per SM) ran 174 us against 217, so the teacher's kernel looks SiLU up
//   where the device holds the table; "teacher, arithmetic" is its other
//   form. Copies with 2 or 4 packs per thread (191 us), a bf16x2 product
//   (the same speed) and the table read through L1 from global memory
//   (265 us) were slower or no faster (bench/README.md section 8).
// - Rope: q's and k's heads in two launches against one (the forward's
//   way where qkv is fused). A 32-bit-index variant measured 1.08x (8B)
//   and 1.18x (1B) in one launch; the teacher's kernel indexes so now.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. bench/probes/elementwise_kernels_probe.cu \
//       teacher_server/kernels/fused_kernels.cu -lcublasLt -o /tmp/ew_probe && /tmp/ew_probe
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/probes/cuda_probe_util.cuh"
#include "teacher_server/kernels/fused_kernels.h"

namespace {

using bf16 = __nv_bfloat16;
using e3::kernels::Dtype;

struct alignas(16) Pack8 {
  bf16 v[8];
};

__device__ __forceinline__ float RoundBf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

constexpr int kRounds = 3;

// Row-major y [m, n] = x [m, k] W^T through cuBLASLt's first choice.
struct Gemm {
  const Lt& lt;
  LtPlan plan;
  const bf16 *x, *w;
  bf16* y;
  void operator()() const { lt.Run(plan, x, w, nullptr, y); }
};

size_t CountDifferent(const bf16* a, const bf16* b, size_t n) {
  std::vector<uint16_t> ha(n), hb(n);
  CHECK_CUDA(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += ha[i] != hb[i];
  return differ;
}

// ---- SiLU-mul ------------------------------------------------------------

// How a variant computes silu(x) as at::silu stores it in bf16:
// x / (1 + exp(-x)) in fp32, rounded once.
// - kExact: that formula (IEEE division, CUDA's accurate expf), as the
//   teacher kernel does.
// - kFastDiv: the same expf, then __fdividef (x times an approximate
//   reciprocal: within 2 ulps of the exact quotient for divisors below
//   2^126, CUDA C Programming Guide, table of intrinsic functions). Only a
//   quotient within 16 ulps of a bf16 rounding midpoint (low 16 bits near
//   0x8000) could round differently, so those, and |x| outside
//   (1e-30, 80) (divisors past 2^126, subnormal quotients), take the exact
//   formula: the stored bits are the exact formula's.
// - kFastExpDiv: also __expf (within 2 + 1.173|x| ulps), so the margin is
//   16 + 4|x| ulps.
// - kNone: no SiLU (gate times up): a bound for the memory traffic alone,
//   not a candidate.
enum class SiluMath { kExact, kFastDiv, kFastExpDiv, kNone };

__device__ __forceinline__ float SiluExact(float x) { return RoundBf16(x / (1.f + expf(-x))); }

template <SiluMath M>
__device__ __forceinline__ float SiluStored(float x) {
  if (M == SiluMath::kNone) return x;
  if (M == SiluMath::kExact) return SiluExact(x);
  const float a = fabsf(x);
  const float q = __fdividef(x, 1.f + (M == SiluMath::kFastExpDiv ? __expf(-x) : expf(-x)));
  const uint32_t margin = M == SiluMath::kFastExpDiv ? 16u + 4u * static_cast<uint32_t>(a < 80.f ? a : 0.f) : 16u;
  // Unsigned wrap-around: true when the low half lies in 0x8000 +- margin.
  const bool near_midpoint = (__float_as_uint(q) & 0xffffu) + margin - 0x8000u <= 2u * margin;
  if (!(a < 80.f && a > 1e-30f) || near_midpoint) return SiluExact(x);
  return RoundBf16(q);
}

// U packs of gate and up per thread, loaded before any is computed; packs
// idx, idx + stride, ... so that each load of a warp is one coalesced run.
template <int U, int B, SiluMath M = SiluMath::kExact>
__global__ void __launch_bounds__(256, B)
    SiluMulVariant(const bf16* __restrict__ gate_up, bf16* __restrict__ out, uint32_t rows, uint32_t cols) {
  const uint32_t packs = cols / 8, total = rows * packs;
  const uint32_t stride = gridDim.x * blockDim.x;
  const Pack8* in = reinterpret_cast<const Pack8*>(gate_up);
  Pack8* o = reinterpret_cast<Pack8*>(out);
  for (uint32_t base = blockIdx.x * blockDim.x + threadIdx.x; base < total; base += stride * U) {
    Pack8 g[U], u[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const uint32_t idx = base + j * stride;
      if (idx < total) {
        const uint32_t row = idx / packs, p = idx - row * packs;
        g[j] = in[row * 2 * packs + p];
        u[j] = in[row * 2 * packs + packs + p];
      }
    }
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const uint32_t idx = base + j * stride;
      if (idx >= total) break;
      Pack8 y;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        // stored in bf16 before the product, as at::silu's output is.
        const float silu = SiluStored<M>(__bfloat162float(g[j].v[i]));
        y.v[i] = __float2bfloat16_rn(silu * __bfloat162float(u[j].v[i]));
      }
      o[idx] = y;
    }
  }
}

template <int U, int B, SiluMath M = SiluMath::kExact>
void LaunchSiluMul(const bf16* gate_up, bf16* out, int rows, int cols) {
  const int64_t work = (int64_t(rows) * cols / 8 + U - 1) / U;
  const int blocks = int(std::min<int64_t>(65536, std::max<int64_t>(1, (work + 255) / 256)));
  SiluMulVariant<U, B, M><<<blocks, 256>>>(gate_up, out, uint32_t(rows), uint32_t(cols));
}

void TeacherSiluMul(const bf16* gate_up, bf16* out, int rows, int cols) {
  if (!e3::kernels::SiluMul(Dtype::kBFloat16, gate_up, out, rows, cols, nullptr, nullptr)) {
    std::printf("the teacher's SiluMul refused the shape\n");
    std::exit(1);
  }
}

// The teacher's kernel without its table: SiLU computed (the form on
// devices with under 128 KiB of shared memory per block).
void TeacherSiluMulArithmetic(const bf16* gate_up, bf16* out, int rows, int cols) {
  e3::kernels::SetSiluMulByTable(false);
  TeacherSiluMul(gate_up, out, rows, cols);
  e3::kernels::SetSiluMulByTable(true);
}

struct SiluVariant {
  const char* name;
  void (*launch)(const bf16*, bf16*, int, int);
  bool checked = true;  // its outputs must be the teacher kernel's bits
};
const SiluVariant kSiluVariants[] = {
    {"teacher kernel", TeacherSiluMul},
    {"U=1 B=8", LaunchSiluMul<1, 8>},
    {"U=2 B=6", LaunchSiluMul<2, 6>},
    {"U=4 B=4", LaunchSiluMul<4, 4>},
    {"U=1 B=8 fast div", LaunchSiluMul<1, 8, SiluMath::kFastDiv>},
    {"U=1 B=8 fast exp+div", LaunchSiluMul<1, 8, SiluMath::kFastExpDiv>},
    {"U=2 B=6 fast exp+div", LaunchSiluMul<2, 6, SiluMath::kFastExpDiv>},
    {"teacher, arithmetic", TeacherSiluMulArithmetic},
    {"bound: no SiLU", LaunchSiluMul<1, 8, SiluMath::kNone>, false},
    // Last in each round as well as first: shows what the position costs.
    {"teacher kernel again", TeacherSiluMul},
};
constexpr int kNumSiluVariants = sizeof(kSiluVariants) / sizeof(kSiluVariants[0]);

void ProbeSiluMul(const Lt& lt) {
  struct MlpShape { const char* name; int rows, hidden, inter; };
  const MlpShape shapes[] = {{"8B 8x1024", 8192, 4096, 14336},
                             {"8B chat mix", 7770, 4096, 14336},
                             {"1B 8x1024", 8192, 2048, 8192}};
  for (const MlpShape& s : shapes) {
    const size_t act = size_t(s.rows) * s.inter;
    bf16 *x, *w, *gate_up, *want, *got;
    CHECK_CUDA(cudaMalloc(&x, size_t(s.rows) * s.hidden * 2));
    CHECK_CUDA(cudaMalloc(&w, size_t(2) * s.inter * s.hidden * 2));
    CHECK_CUDA(cudaMalloc(&gate_up, act * 4));
    CHECK_CUDA(cudaMalloc(&want, act * 2));
    CHECK_CUDA(cudaMalloc(&got, act * 2));
    // Activations of unit scale and weights of 1/sqrt(hidden)'s order:
    // gate values of unit scale, where SiLU is neither linear nor zero.
    FillRandom<<<1024, 256>>>(x, size_t(s.rows) * s.hidden, 1, 1.7f);
    FillRandom<<<1024, 256>>>(w, size_t(2) * s.inter * s.hidden, 2, 1.7f / 64);
    Gemm gemm{lt, lt.Plan(Shape{"gate_up", s.rows, 2 * s.inter, s.hidden}), x, w, gate_up};
    if (gemm.plan.count == 0) {
      std::printf("%s: cuBLASLt has no algorithm for the gate_up GEMM\n", s.name);
      std::exit(1);
    }
    gemm();
    TeacherSiluMul(gate_up, want, s.rows, s.inter);
    bool ok[kNumSiluVariants];
    for (int v = 0; v < kNumSiluVariants; ++v) {
      ok[v] = true;
      if (!kSiluVariants[v].checked) continue;
      CHECK_CUDA(cudaMemset(got, 0xff, act * 2));
      kSiluVariants[v].launch(gate_up, got, s.rows, s.inter);
      CHECK_CUDA(cudaGetLastError());
      const size_t differ = CountDifferent(want, got, act);
      ok[v] = differ == 0;
      if (!ok[v]) {
        std::printf("%s silu-mul %s: %zu of %zu outputs differ from the teacher kernel's\n", s.name,
                    kSiluVariants[v].name, differ, act);
      }
    }
    std::vector<double> alone[kNumSiluVariants], in_sequence[kNumSiluVariants];
    for (int r = 0; r < kRounds; ++r) {
      for (int v = 0; v < kNumSiluVariants; ++v) {
        if (!ok[v]) continue;
        alone[v].push_back(TimeMs([&] { kSiluVariants[v].launch(gate_up, got, s.rows, s.inter); }, 100));
        in_sequence[v].push_back(TimeMs([&] {
          gemm();
          kSiluVariants[v].launch(gate_up, got, s.rows, s.inter);
        }, 30));
      }
    }
    const double bytes = 3.0 * act * 2;
    const double base_alone = Median(alone[0]), base_seq = Median(in_sequence[0]);
    std::printf("silu-mul %s (%d x %d, %.2f GB per call), medians of %d interleaved rounds:\n", s.name, s.rows,
                s.inter, bytes / 1e9, kRounds);
    for (int v = 0; v < kNumSiluVariants; ++v) {
      if (!ok[v]) continue;
      const double a = Median(alone[v]), q = Median(in_sequence[v]);
      std::printf("  %-21s alone %7.1f us (%4.2f TB/s, %.3fx)   after gate_up %8.3f ms (%.3fx)\n",
                  kSiluVariants[v].name, a * 1e3, bytes / a / 1e9, base_alone / a, q, base_seq / q);
    }
    DestroyPlan(gemm.plan);
    cudaFree(x); cudaFree(w); cudaFree(gate_up); cudaFree(want); cudaFree(got);
  }
}

// ---- rope ----------------------------------------------------------------

struct AttnShape { const char* name; int rows, hidden, heads, kv_heads, head_dim; };

void TeacherRope(bf16* qkv, const AttnShape& s, int heads, int64_t offset, const bf16* cos, const bf16* sin) {
  const int64_t row_stride = int64_t(s.heads + 2 * s.kv_heads) * s.head_dim;
  if (!e3::kernels::RopeInPlace(Dtype::kBFloat16, qkv + offset, s.rows, heads, row_stride, s.head_dim, s.head_dim,
                                cos, sin, nullptr)) {
    std::printf("the teacher's RopeInPlace refused the shape\n");
    std::exit(1);
  }
}

void ProbeRope(const Lt& lt) {
  const AttnShape shapes[] = {{"8B 8x1024", 8192, 4096, 32, 8, 128}, {"1B 8x1024", 8192, 2048, 32, 8, 64}};
  for (const AttnShape& s : shapes) {
    const int qkv_cols = (s.heads + 2 * s.kv_heads) * s.head_dim;
    const size_t n = size_t(s.rows) * qkv_cols;
    bf16 *x, *w, *qkv, *want, *cos, *sin;
    CHECK_CUDA(cudaMalloc(&x, size_t(s.rows) * s.hidden * 2));
    CHECK_CUDA(cudaMalloc(&w, size_t(qkv_cols) * s.hidden * 2));
    CHECK_CUDA(cudaMalloc(&qkv, n * 2));
    CHECK_CUDA(cudaMalloc(&want, n * 2));
    CHECK_CUDA(cudaMalloc(&cos, size_t(s.rows) * s.head_dim * 2));
    CHECK_CUDA(cudaMalloc(&sin, size_t(s.rows) * s.head_dim * 2));
    FillRandom<<<1024, 256>>>(x, size_t(s.rows) * s.hidden, 3, 1.7f);
    FillRandom<<<1024, 256>>>(w, size_t(qkv_cols) * s.hidden, 4, 1.7f / 64);
    FillRandom<<<1024, 256>>>(cos, size_t(s.rows) * s.head_dim, 5);
    FillRandom<<<1024, 256>>>(sin, size_t(s.rows) * s.head_dim, 6);
    Gemm gemm{lt, lt.Plan(Shape{"qkv", s.rows, qkv_cols, s.hidden}), x, w, qkv};
    if (gemm.plan.count == 0) {
      std::printf("%s: cuBLASLt has no algorithm for the qkv GEMM\n", s.name);
      std::exit(1);
    }
    const int64_t k_offset = int64_t(s.heads) * s.head_dim;
    struct RopeVariantRun {
      const char* name;
      std::function<void()> run;
    };
    const RopeVariantRun variants[] = {
        {"teacher kernel, q and k apart (2 launches)",
         [&] {
           TeacherRope(qkv, s, s.heads, 0, cos, sin);
           TeacherRope(qkv, s, s.kv_heads, k_offset, cos, sin);
         }},
        {"teacher kernel, q and k in one launch", [&] { TeacherRope(qkv, s, s.heads + s.kv_heads, 0, cos, sin); }},
    };
    constexpr int kNum = sizeof(variants) / sizeof(variants[0]);
    gemm();
    variants[0].run();
    CHECK_CUDA(cudaMemcpy(want, qkv, n * 2, cudaMemcpyDeviceToDevice));
    bool ok[kNum];
    for (int v = 0; v < kNum; ++v) {
      gemm();
      variants[v].run();
      CHECK_CUDA(cudaGetLastError());
      const size_t differ = CountDifferent(want, qkv, n);
      ok[v] = differ == 0;
      if (!ok[v]) std::printf("%s rope %s: %zu of %zu values differ\n", s.name, variants[v].name, differ, n);
    }
    std::vector<double> alone[kNum], in_sequence[kNum];
    for (int r = 0; r < kRounds; ++r) {
      for (int v = 0; v < kNum; ++v) {
        if (!ok[v]) continue;
        // In place: repeated rotations change the values, not the work.
        alone[v].push_back(TimeMs(variants[v].run, 100));
        in_sequence[v].push_back(TimeMs([&] {
          gemm();
          variants[v].run();
        }, 50));
      }
    }
    // q and k read and written, cos and sin read once per token.
    const double bytes = 2.0 * s.rows * (s.heads + s.kv_heads) * s.head_dim * 2;
    std::printf("rope %s (q %d and k %d heads of %d; %.2f GB per call), medians of %d interleaved rounds:\n",
                s.name, s.heads, s.kv_heads, s.head_dim, bytes / 1e9, kRounds);
    for (int v = 0; v < kNum; ++v) {
      if (!ok[v]) continue;
      const double a = Median(alone[v]), q = Median(in_sequence[v]);
      std::printf("  %-44s alone %6.1f us (%4.2f TB/s, %.3fx)   after qkv %7.3f ms (%.3fx)\n", variants[v].name,
                  a * 1e3, bytes / a / 1e9, Median(alone[0]) / a, q, Median(in_sequence[0]) / q);
    }
    DestroyPlan(gemm.plan);
    cudaFree(x); cudaFree(w); cudaFree(qkv); cudaFree(want); cudaFree(cos); cudaFree(sin);
  }
}

}  // namespace

int main() {
  const Lt lt;
  ProbeSiluMul(lt);
  ProbeRope(lt);
  return 0;
}
