// A bf16 GEMM for Hopper (sm_90a) whose epilogue does what the teacher
// otherwise does in a separate memory-bound pass over the GEMM's output:
//   kStore  : out = bf16(x W^T [+ residual])            (o_proj, down_proj)
//   kSwiGlu : out = bf16(bf16(silu(g)) * u), g and u being the two halves of
//             the gate_up product, never stored          (gate_up + SiLU-mul)
//   kArgmax : the row's argmax over bf16(x W^T), never storing the logits
//                                                        (lm_head's target)
// x: [M, K] and W: [N, K], both K-contiguous (row-major activations, the
// nn.Linear weight layout). Accumulation is fp32; every value is rounded to
// bf16 exactly where transformers stores a tensor, so the fused forms give
// the unfused forms' numbers up to the order of the fp32 K-sum.
//
// The kernel is persistent (one CTA per SM looping over output tiles,
// clusters of two CTAs sharing W's 256-row tile by TMA multicast) and
// warp-specialised: one thread of the first warpgroup issues the TMA loads
// of a 4-stage shared-memory ring, the other two warpgroups multiply with
// wgmma (m64n256k16, fp32 accumulators in registers) and run the epilogue
// from those registers while the producer already loads the next tile.
// Pipeline hand-off uses mbarriers: `full[s]` completes when stage s's
// bytes have landed, `empty[s]` when its readers in both cluster CTAs are
// done with it. Two schedules (Schedule below): cooperative (both
// consumers on one 128-row tile) and ping-pong (alternate 64-row tiles,
// one consumer's epilogue under the other's multiplications).
//
// What pays (bench/results/2026-12-01-teacher-ablation-cuda-graphs.md): kArgmax beats cuBLASLt + the
// row-argmax kernel (the logits never reach memory), so the sgl teacher
// uses it (cooperative) for the lm_head. Cooperative kStore is no faster
// than cuBLASLt without a residual and slower with one, and cooperative
// kSwiGlu's epilogue math, which the tensor cores wait for, costs more
// than the SiLU-mul pass it saves; the teacher uses neither. The ping-pong
// schedule serves that SwiGLU case: its outputs are bit-identical to
// cuBLASLt's (clean under compute-sanitizer), but it is slower on every
// shape, so the teacher does not use it either.
//
// Header-only: hopper_gemm.cu instantiates the schedules the teacher
// launches; a benchmark of the others instantiates them the same way. No
// LibTorch here.
#ifndef E3_KERNELS_HOPPER_GEMM_KERNEL_CUH_
#define E3_KERNELS_HOPPER_GEMM_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>

#include "kernels/argmax_key.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define E3_HOPPER_GEMM_DEVICE_CODE 1
#endif

namespace e3::kernels::hopper {

enum class Epilogue { kStore, kSwiGlu, kArgmax };

struct EpilogueArgs {
  __nv_bfloat16* out = nullptr;             // kStore [M, N], kSwiGlu [M, N / 2]
  int64_t out_stride = 0;                   // elements between rows of out
  const __nv_bfloat16* residual = nullptr;  // kStore only, optional, [M, N]
  int64_t residual_stride = 0;
  unsigned long long* argmax_keys = nullptr;  // kArgmax: [M], zeroed before the launch
};

constexpr int kBlockN = 256;
constexpr int kBlockK = 64;  // 64 bf16 = one 128-byte swizzle row
constexpr int kStages = 4;
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
constexpr int kBBytes = kBlockN * kBlockK * 2;
// Two CTAs of a cluster take vertically adjacent tiles, which need the same
// 256 rows of W: each loads 128 of them and multicasts them to both, so
// L2 serves a third less per stage than with one CTA per tile.
#ifndef E3_HOPPER_GEMM_CLUSTER
#define E3_HOPPER_GEMM_CLUSTER 2
#endif
constexpr int kCluster = E3_HOPPER_GEMM_CLUSTER;
constexpr int kBHalfBytes = kBBytes / kCluster;
// The epilogue stages each consumer's output through shared memory in
// [64 rows, 64 columns] chunks (two buffers per consumer, 128-byte
// swizzled so that the fragment writes hit 32 different banks) and
// writes them out with TMA stores, which run while the next tile's
// multiplications start.
constexpr int kChunkBytes = 64 * 64 * 2;
constexpr int kStagingBytes = 2 * 2 * kChunkBytes;

// How the two consumer warpgroups share the work:
// - kCooperative: both multiply one 128-row tile (64 rows each) and run
//   its epilogue together, while the tensor cores wait;
// - kPingPong: each takes every other 64-row tile, so that one's epilogue
//   runs while the other multiplies (the schedule of CUTLASS's Pingpong
//   kernels), at the price of 1.5x the L2 traffic per multiply.
enum class Schedule { kCooperative, kPingPong };

template <Schedule kS>
struct Tiling {
  static constexpr int kRows = kS == Schedule::kCooperative ? 128 : 64;  // rows of x per CTA tile
  static constexpr int kABytes = kRows * kBlockK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // The ring, the staging buffers, the barriers, and slack to align the
  // ring to 1024 bytes (the 128-byte swizzle pattern repeats every 8 rows
  // of 128 bytes): 230,464 bytes (cooperative) of the 232,448 an sm_90
  // block may have.
  static constexpr int kSmemBytes = kStages * kStageBytes + kStagingBytes + 2 * kStages * 8 + 1024;
  // Consumer warpgroups that read each stage, in both cluster CTAs.
  static constexpr uint32_t kStageReaders = (kS == Schedule::kCooperative ? 2 : 1) * kCluster;
};
// kSwiGlu: each 256-column tile holds 128 gate columns and the 128 up
// columns of the same features (bench/results/2026-12-07-rejected-experiments.md).
constexpr int kSwiGluHalf = kBlockN / 2;

#ifdef E3_HOPPER_GEMM_DEVICE_CODE
namespace device {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Synchronises the 128 threads of one consumer warpgroup (ids 1 and 2;
// 0 is __syncthreads).
__device__ __forceinline__ void WarpgroupSync(int consumer) {
  asm volatile("bar.sync %0, 128;" ::"r"(consumer + 1) : "memory");
}

// Named barrier `id` (3 and 4 here) over 256 threads: 128 arrive without
// waiting, 128 wait for them.
__device__ __forceinline__ void NamedArrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void NamedSync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }

__device__ __forceinline__ void BarrierInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}

__device__ __forceinline__ void BarrierExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)), "r"(bytes)
               : "memory");
}

// Arrives on the barrier at the same shared-memory offset in cluster CTA
// `rank` (this CTA's own included).
__device__ __forceinline__ void BarrierArriveCluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(rank)
      : "memory");
}

// One consumer is done reading a stage: tells the producers of both
// cluster CTAs, which both write into it.
__device__ __forceinline__ void ReleaseStage(uint64_t* empty_bar) {
#pragma unroll
  for (uint32_t r = 0; r < kCluster; ++r) BarrierArriveCluster(empty_bar, r);
}

// Returns once the barrier's phase of the given parity has completed.
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = SmemAddr(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
}

// A [rows, 64] box of a K-contiguous bf16 matrix at (k, row) into shared
// memory, 128-byte swizzled, completing `bar`'s transaction bytes.
__device__ __forceinline__ void TmaLoad(void* dst, const CUtensorMap* map, uint64_t* bar, int k, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(k), "r"(row)
      : "memory");
}

// The same, landing at the same offset (and completing the barrier at the
// same offset) in every CTA of `cta_mask`.
__device__ __forceinline__ void TmaLoadMulticast(void* dst, const CUtensorMap* map, uint64_t* bar, int k, int row,
                                                 uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(k), "r"(row), "h"(cta_mask)
      : "memory");
}

// Shared memory [64 rows, 64 columns] (128-byte swizzled) to global at
// (col, row); rows and columns past the matrix's end are not written.
__device__ __forceinline__ void TmaStore(const CUtensorMap* map, const void* src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(SmemAddr(src)), "r"(col), "r"(row)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most kPending stores still read their shared memory.
template <int kPending>
__device__ __forceinline__ void TmaStoreWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// wgmma's shared-memory matrix descriptor for a K-major tile written by
// TMA with the 128-byte swizzle: rows of 128 bytes, 8-row groups 1024
// bytes apart (stride byte offset), leading byte offset unused.
__device__ __forceinline__ uint64_t SmemDescriptor(const void* p) {
  const uint64_t addr = SmemAddr(p);
  uint64_t desc = (addr & 0x3ffff) >> 4;
  desc |= uint64_t{1} << 16;
  desc |= uint64_t{1024 >> 4} << 32;
  desc |= uint64_t{1} << 62;
  return desc;
}

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma boundaries.
__device__ __forceinline__ void FenceAccumulators(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A[64 x 16] * B[256 x 16]^T; accumulate=false overwrites d.
// Accumulator layout (PTX ISA, wgmma m64nNk16 D fragment): thread t of the
// warpgroup holds rows 16 * (t / 32) + (t % 32) / 4 + {0, 8} and columns
// 8 * j + 2 * (t % 4) + {0, 1} in d[4 * j + 2 * row_half + col].
__device__ __forceinline__ void Wgmma(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

__device__ __forceinline__ void SetMaxRegisters(bool producer) {
  if (producer) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  }
}

// Work unit u of the persistent loop: a pair of vertically adjacent tiles
// (one per cluster CTA). Units walk down `group_m` pairs before moving
// one column tile right, so the clusters running at one time share rows
// of x and columns of W in L2.
__device__ __forceinline__ void UnitCoords(int u, int pairs_m, int tiles_n, int group_m, int* pair_m, int* tn) {
  const int group_size = group_m * tiles_n;
  const int first = (u / group_size) * group_m;
  const int rows_in_group = min(pairs_m - first, group_m);
  const int in_group = u % group_size;
  *pair_m = first + in_group % rows_in_group;
  *tn = in_group / rows_in_group;
}

// This CTA's tile of work unit u.
__device__ __forceinline__ void TileOfUnit(int u, int pairs_m, int tiles_n, int group_m, uint32_t rank, int* tm,
                                           int* tn) {
  int pair_m;
  UnitCoords(u, pairs_m, tiles_n, group_m, &pair_m, tn);
  *tm = pair_m * kCluster + static_cast<int>(rank);
}

// A position in the stage ring: the stage, and the parity of the ring's
// current pass (the phase its barriers are waited on with).
struct RingCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Moves past n stages that another consumer reads.
  __device__ __forceinline__ void Skip(int n) {
    stage += n;
    phase ^= static_cast<uint32_t>(stage / kStages) & 1u;
    stage %= kStages;
  }
};

__device__ __forceinline__ float RoundBf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// bf16(silu(g)) as at::silu computes and stores it: fp32 g / (1 + expf(-g)),
// rounded to bf16. (A fast exponential and division with an exact
// fallback near bf16 rounding midpoints is slower in this epilogue;
// bench/results/2026-12-07-rejected-experiments.md.)
__device__ __forceinline__ float SiluBf16(float g) { return RoundBf16(g / (1.f + expf(-g))); }

// Writes two adjacent outputs of chunk-local (row, col) into a [64, 64]
// 128-byte-swizzled staging chunk: 16-byte unit col / 8 of row `row`
// lands at unit (col / 8) ^ (row % 8).
__device__ __forceinline__ void StagePair(uint8_t* chunk, int row, int col, float v0, float v1) {
  const int unit = (col / 8) ^ (row % 8);
  *reinterpret_cast<__nv_bfloat162*>(chunk + row * 128 + unit * 16 + (col % 8) * 2) = __floats2bfloat162_rn(v0, v1);
}

// The epilogue of this consumer's 64 rows from row0 of column tile tn.
template <Epilogue kEp>
__device__ __forceinline__ void RunEpilogue(const float (&d)[128], int row0, int tn, int consumer, int M, int N,
                                            const EpilogueArgs& ep, const CUtensorMap* map_out, uint8_t* staging,
                                            int* chunk_counter) {
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  const int row_in_wg = (t / 32) * 16 + lane / 4;  // + 8 * half
  const int col_in_unit = 2 * (lane % 4);          // + 8 * j
  if constexpr (kEp == Epilogue::kArgmax) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + row_in_wg + 8 * half;
      // This thread's best of its 64 columns in float compares (columns
      // visited in increasing order, so ties keep the first); one key
      // at the end.
      float best_value = 0.f;
      int best_col = -1;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = tn * kBlockN + 8 * j + col_in_unit + e;
          const float v = RoundBf16(d[4 * j + 2 * half + e]);
          const bool better = best_col < 0 || v > best_value || (v != v && best_value == best_value);
          if (col < N && better) {
            best_value = v;
            best_col = col;
          }
        }
      }
      unsigned long long best = best_col < 0 ? 0ull : ArgmaxKey(best_value, static_cast<uint32_t>(best_col));
      // The row's four threads are lanes 4q..4q+3 of one warp.
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
      }
      if (lane % 4 == 0 && row < M && best != 0) atomicMax(ep.argmax_keys + row, best);
    }
  } else {
    // kStore: four 64-column chunks of the 256-column tile; kSwiGlu: two
    // chunks of 64 features, gate from d[j], up from d[j + 16].
    constexpr int kChunks = kEp == Epilogue::kStore ? 4 : 2;
    const int out_col0 = kEp == Epilogue::kStore ? tn * kBlockN : tn * kSwiGluHalf;
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      uint8_t* chunk = staging + (*chunk_counter % 2) * kChunkBytes;
      ++*chunk_counter;
      // The store that last read this buffer (two chunks ago) is done.
      if (t == 0) TmaStoreWaitRead<1>();
      WarpgroupSync(consumer);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row_in_wg + 8 * half;
        const int grow = row0 + r;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = q * 8 + jj;
          const int c = 8 * jj + col_in_unit;
          float v0 = d[4 * j + 2 * half], v1 = d[4 * j + 2 * half + 1];
          if constexpr (kEp == Epilogue::kStore) {
            if (ep.residual != nullptr && grow < M && out_col0 + 64 * q + c < N) {
              const float2 res = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
                  ep.residual + static_cast<int64_t>(grow) * ep.residual_stride + out_col0 + 64 * q + c));
              v0 += res.x;
              v1 += res.y;
            }
          } else {
            v0 = SiluBf16(RoundBf16(v0)) * RoundBf16(d[4 * (j + 16) + 2 * half]);
            v1 = SiluBf16(RoundBf16(v1)) * RoundBf16(d[4 * (j + 16) + 2 * half + 1]);
          }
          StagePair(chunk, r, c, v0, v1);
        }
      }
      // Make the generic-proxy writes visible to the TMA engine.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      WarpgroupSync(consumer);
      if (t == 0) TmaStore(map_out, chunk, out_col0 + 64 * q, row0);
    }
  }
}

}  // namespace device
#endif  // E3_HOPPER_GEMM_DEVICE_CODE

template <Epilogue kEp, Schedule kS>
__global__ void __launch_bounds__(kThreads, 1)
    GemmKernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
               const __grid_constant__ CUtensorMap map_out, int M, int N, int K, int group_m, EpilogueArgs ep) {
#ifdef E3_HOPPER_GEMM_DEVICE_CODE
  using namespace device;
  using T = Tiling<kS>;
  constexpr bool kCooperative = kS == Schedule::kCooperative;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* staging = ring + kStages * T::kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + kStagingBytes);
  uint64_t* empty = full + kStages;
  const int warpgroup = threadIdx.x / 128;
  const uint32_t rank = ClusterRank();
  const int cluster = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  const int tiles_m = (M + T::kRows - 1) / T::kRows;
  const int pairs_m = (tiles_m + kCluster - 1) / kCluster;
  const int tiles_n = (N + kBlockN - 1) / kBlockN;
  const int units = pairs_m * tiles_n;
  const int k_blocks = (K + kBlockK - 1) / kBlockK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(&full[s], 1);
      // The readers in both CTAs: each CTA's producer writes its half of
      // W's rows into both CTAs' stage.
      BarrierInit(&empty[s], T::kStageReaders);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  ClusterSync();

  if (warpgroup == 0) {
    SetMaxRegisters(true);
    if (threadIdx.x == 0) {
      RingCursor at;
      for (int u = cluster; u < units; u += clusters) {
        int tm, tn;
        TileOfUnit(u, pairs_m, tiles_n, group_m, rank, &tm, &tn);
        for (int kb = 0; kb < k_blocks; ++kb) {
          BarrierWait(&empty[at.stage], at.phase ^ 1);  // a fresh barrier counts as released
          uint8_t* a = ring + at.stage * T::kStageBytes;
          BarrierExpectBytes(&full[at.stage], T::kStageBytes);
          TmaLoad(a, &map_x, &full[at.stage], kb * kBlockK, tm * T::kRows);
          TmaLoadMulticast(a + T::kABytes + rank * kBHalfBytes, &map_w, &full[at.stage], kb * kBlockK,
                           tn * kBlockN + static_cast<int>(rank) * (kBlockN / kCluster), (1u << kCluster) - 1);
          at.Advance();
        }
      }
    }
  } else {
    SetMaxRegisters(false);
    const int consumer = warpgroup - 1;
    const bool releases = threadIdx.x % 128 == 0;
    uint8_t* my_staging = staging + consumer * 2 * kChunkBytes;
    int chunk_counter = 0;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    RingCursor at;
    int index = 0;  // of the unit in this CTA's sequence
    const int my_units = cluster < units ? (units - 1 - cluster) / clusters + 1 : 0;
    for (int u = cluster; u < units; u += clusters, ++index) {
      if (!kCooperative && index % 2 != consumer) {
        at.Skip(k_blocks);  // the other consumer's tile
        continue;
      }
      // Ping-pong: start waiting for this tile's stages only once the other
      // consumer has waited for all of its previous tile's. The stage
      // barriers are waited on by parity, which cannot tell a phase from
      // the one a whole ring pass later.
      if (!kCooperative && index > 0) NamedSync(3 + consumer);
      int tm, tn;
      TileOfUnit(u, pairs_m, tiles_n, group_m, rank, &tm, &tn);
      int previous = -1;
      for (int kb = 0; kb < k_blocks; ++kb) {
        BarrierWait(&full[at.stage], at.phase);
        const uint8_t* a = ring + at.stage * T::kStageBytes + (kCooperative ? consumer * (64 * 128) : 0);
        const uint8_t* b = ring + at.stage * T::kStageBytes + T::kABytes;
        FenceAccumulators(d);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kBlockK / 16; ++kk) {
          Wgmma(d, SmemDescriptor(a + 32 * kk), SmemDescriptor(b + 32 * kk), kb > 0 || kk > 0);
        }
        WgmmaCommit();
        FenceAccumulators(d);
        // Keep this stage's MMAs in flight; the previous stage's are done.
        WgmmaWait<1>();
        if (previous >= 0 && releases) ReleaseStage(&empty[previous]);
        previous = at.stage;
        at.Advance();
      }
      if (!kCooperative && index + 1 < my_units) NamedArrive(3 + (1 - consumer));
      WgmmaWait<0>();
      FenceAccumulators(d);
      if (previous >= 0 && releases) ReleaseStage(&empty[previous]);
      const int row0 = tm * T::kRows + (kCooperative ? consumer * 64 : 0);
      RunEpilogue<kEp>(d, row0, tn, consumer, M, N, ep, &map_out, my_staging, &chunk_counter);
    }
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  // The peer may still multicast into this CTA's ring or arrive on its
  // barriers until it, too, is done.
  ClusterSync();
#endif
}

// Encodes a [rows, cols] row-major bf16 matrix (row stride in elements) as
// a TMA descriptor with [box_rows, 64] boxes, 128-byte swizzled. Uses the
// driver entry point through the runtime so that nothing links libcuda.
inline bool EncodeTensorMap(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int64_t row_stride,
                            int box_rows) {
  using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static EncodeFn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<EncodeFn>(nullptr);
    }
    return reinterpret_cast<EncodeFn>(fn);
  }();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// What the kernel takes: K-contiguous 16-byte-aligned operands and output
// with 16-byte row strides, and (kSwiGlu) whole 256-column tiles.
inline bool Supports(Epilogue ep, int64_t M, int64_t N, int64_t K, const void* x, int64_t x_stride, const void* w,
                     int64_t w_stride, const EpilogueArgs& args) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (M <= 0 || N <= 0 || K <= 0 || M > (1 << 30) || N > (1 << 30) || K > (1 << 30)) return false;
  // Work units (pairs of 64-row tiles at most, 256-column tiles) count in int.
  if (((M + 127) / 128) * ((N + kBlockN - 1) / kBlockN) > INT_MAX) return false;
  if (!aligned(x) || !aligned(w) || x_stride % 8 != 0 || w_stride % 8 != 0 || K % 8 != 0 || N % 8 != 0) return false;
  if (ep == Epilogue::kArgmax) return args.argmax_keys != nullptr;
  if (args.out == nullptr || !aligned(args.out) || args.out_stride % 8 != 0) return false;
  if (ep == Epilogue::kSwiGlu && N % kBlockN != 0) return false;
  if (args.residual != nullptr && (!aligned(args.residual) || args.residual_stride % 2 != 0)) return false;
  return true;
}

// The launch configuration of GemmKernel<kEp, kS>: `clusters` clusters of
// kCluster CTAs. Not copyable: config.attrs points into the object.
template <Schedule kS>
struct ClusterLaunchConfig {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[1];
  ClusterLaunchConfig(int clusters, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.gridDim = dim3(kCluster * clusters);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = Tiling<kS>::kSmemBytes;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  ClusterLaunchConfig(const ClusterLaunchConfig&) = delete;
  ClusterLaunchConfig& operator=(const ClusterLaunchConfig&) = delete;
};

// How many clusters of this kernel fit on CUDA device `device` at once
// (the persistent grid's size); 0 when the device cannot run it. Asked
// once per device, with that device made current for the query (the
// shared-memory opt-in it sets is per device); a failed query counts as 0
// for the rest of the process.
template <Epilogue kEp, Schedule kS = Schedule::kCooperative>
inline int ResidentClusters(int device) {
  static std::atomic<int> cached[64] = {};  // clusters + 1; 0: not asked yet
  if (device < 0 || device >= 64) return 0;
  const int known = cached[device].load(std::memory_order_acquire);
  if (known > 0) return known - 1;
  int clusters = 0;
  int previous = -1;
  cudaDeviceProp prop;
  bool failed = cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
                cudaGetDeviceProperties(&prop, device) != cudaSuccess;
  if (!failed && prop.major == 9) {
    failed = cudaFuncSetAttribute(GemmKernel<kEp, kS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Tiling<kS>::kSmemBytes) != cudaSuccess;
    if (!failed) {
      const ClusterLaunchConfig<kS> launch(prop.multiProcessorCount, nullptr);
      if (cudaOccupancyMaxActiveClusters(&clusters, GemmKernel<kEp, kS>, &launch.config) != cudaSuccess) {
        failed = true;
        clusters = 0;
      }
    }
  }
  if (previous >= 0 && previous != device && cudaSetDevice(previous) != cudaSuccess) failed = true;
  // A refused query must not leave its error for the next launch check.
  if (failed) cudaGetLastError();
  cached[device].store(clusters + 1, std::memory_order_release);
  return clusters;
}

// Launches the epilogue of x W^T on `stream` (current device). Returns
// false when nothing was launched (not an sm_90 device, an unsupported
// shape, a descriptor or launch failure); the caller then runs its
// unfused path.
template <Epilogue kEp, Schedule kS = Schedule::kCooperative>
inline bool Launch(const __nv_bfloat16* x, int64_t x_stride, const __nv_bfloat16* w, int64_t w_stride, int M, int N,
                   int K, const EpilogueArgs& ep, int group_m, cudaStream_t stream) {
  if (!Supports(kEp, M, N, K, x, x_stride, w, w_stride, ep)) return false;
  if (group_m < 1) group_m = 1;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const int resident = ResidentClusters<kEp, kS>(device);
  if (resident <= 0) return false;
  CUtensorMap map_x, map_w, map_out = {};
  if (!EncodeTensorMap(&map_x, x, M, K, x_stride, Tiling<kS>::kRows) ||
      !EncodeTensorMap(&map_w, w, N, K, w_stride, kBlockN / kCluster)) {
    return false;
  }
  if (kEp != Epilogue::kArgmax) {
    const int64_t out_cols = kEp == Epilogue::kSwiGlu ? N / 2 : N;
    if (!EncodeTensorMap(&map_out, ep.out, M, out_cols, ep.out_stride, 64)) return false;
  }
  const int tiles_m = (M + Tiling<kS>::kRows - 1) / Tiling<kS>::kRows;
  const int units = ((tiles_m + kCluster - 1) / kCluster) * ((N + kBlockN - 1) / kBlockN);
  const ClusterLaunchConfig<kS> launch(units < resident ? units : resident, stream);
  if (cudaLaunchKernelEx(&launch.config, GemmKernel<kEp, kS>, map_x, map_w, map_out, M, N, K, group_m, ep) !=
      cudaSuccess) {
    cudaGetLastError();  // the caller falls back; its own launch checks must not see this
    return false;
  }
  return true;
}

// kArgmax's keys (zeroed before the GEMM) to column indices, one thread
// per row. A template so that every file that includes this header may
// define it.
template <int kRowsPerBlock>
__global__ void __launch_bounds__(kRowsPerBlock) KeysToIndexKernel(const unsigned long long* keys, int32_t* out,
                                                                   int64_t rows) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x;
  if (i < rows) out[i] = ArgmaxFromKey(keys[i]);
}

inline void KeysToIndex(const unsigned long long* keys, int32_t* out, int64_t rows, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 256;
  const auto blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  KeysToIndexKernel<kRowsPerBlock><<<blocks, kRowsPerBlock, 0, stream>>>(keys, out, rows);
}

}  // namespace e3::kernels::hopper

#endif  // E3_KERNELS_HOPPER_GEMM_KERNEL_CUH_
