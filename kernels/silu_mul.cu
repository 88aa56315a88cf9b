// SiLU-mul over a fused gate/up projection: the teacher's forward
// (teacher_ops.h, SiluMul) and the student's forward and backward
// (student_ops.h, SiluMulForward, SiluMulBackward). Both read one 16-byte
// pack of gate and one of up per thread and grid-stride step. Each keeps
// its own SiLU: the teacher's reproduces at::silu's stored bits, x / (1 +
// exp(-x)) with an IEEE division (or a table of them), the student's
// computes x * sigmoid(x), which may round differently.
#include <atomic>
#include <mutex>

#include "kernels/common.cuh"
#include "kernels/student_ops.h"
#include "kernels/teacher_ops.h"

namespace e3::kernels {
namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------
// The teacher's SiluMul: 32-bit indices where they fit, SiLU by table where
// the device has the shared memory for it.

constexpr int64_t kMaxBlocks = 65536;  // the arithmetic kernel's grid

// With 32-bit indices (FitsUint32) the arithmetic kernel needs few enough
// registers for a full SM of threads (8 blocks of 256; 64-bit indices take
// 35 registers, which leaves 7).
constexpr int kFullSmBlocks = 8;
template <typename Index>
constexpr int SiluMulMinBlocks() {
  return sizeof(Index) == 4 ? kFullSmBlocks : 1;
}

// silu(x) as at::silu stores it in T: x / (1 + exp(-x)) in fp32 (CUDA's
// accurate expf, IEEE division), rounded once.
template <typename T>
__device__ __forceinline__ float SiluExact(float x) {
  return RoundTo<T>(x / (1.f + expf(-x)));
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
    if (a < 80.f && a > 1e-30f && clear_of_midpoint) return RoundTo<T>(q);
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
// arithmetic kernel (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md), same bits. The product stays in
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
  SiluMulKernel<T, Index><<<GridBlocks(packs, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
      in, o, static_cast<Index>(rows), static_cast<Index>(cols), row_limit);
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

// ---------------------------------------------------------------------------
// The student's SiluMulForward and SiluMulBackward.

__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

template <typename T>
__global__ void SiluMulForwardKernel(const T* __restrict__ gate_up, T* __restrict__ out,
                                     int64_t rows, int64_t packs_per_row) {
  using P = Pack<T, kVec>;
  const int64_t total = rows * packs_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / packs_per_row, p = i % packs_per_row;
    const P* row = reinterpret_cast<const P*>(gate_up) + r * 2 * packs_per_row;
    const P g = row[p];
    const P u = row[packs_per_row + p];
    P o;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float gf = Num<T>::ToF(g.v[e]);
      const float silu = RoundTo<T>(gf * Sigmoid(gf));
      o.v[e] = Num<T>::FromF(silu * Num<T>::ToF(u.v[e]));
    }
    reinterpret_cast<P*>(out)[i] = o;
  }
}

template <typename T>
__global__ void SiluMulBackwardKernel(const T* __restrict__ dout, const T* __restrict__ gate_up,
                                      T* __restrict__ d_gate_up, int64_t rows,
                                      int64_t packs_per_row) {
  using P = Pack<T, kVec>;
  const int64_t total = rows * packs_per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / packs_per_row, p = i % packs_per_row;
    const P* row = reinterpret_cast<const P*>(gate_up) + r * 2 * packs_per_row;
    P* drow = reinterpret_cast<P*>(d_gate_up) + r * 2 * packs_per_row;
    const P g = row[p];
    const P u = row[packs_per_row + p];
    const P d = reinterpret_cast<const P*>(dout)[i];
    P dg, du;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float gf = Num<T>::ToF(g.v[e]);
      const float df = Num<T>::ToF(d.v[e]);
      const float s = Sigmoid(gf);
      const float silu = gf * s;
      dg.v[e] = Num<T>::FromF(df * Num<T>::ToF(u.v[e]) * s * (1.f + gf * (1.f - s)));
      du.v[e] = Num<T>::FromF(df * RoundTo<T>(silu));
    }
    drow[p] = dg;
    drow[packs_per_row + p] = du;
  }
}

bool Takes(int64_t rows, int64_t cols, const void* a, const void* b, const void* c) {
  return rows > 0 && cols > 0 && cols % kVec == 0 && Aligned16(a) && Aligned16(b) &&
         (c == nullptr || Aligned16(c));
}

}  // namespace

bool SiluMul(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t cols, const int32_t* row_limit,
             void* stream) {
  if (rows <= 0 || cols % kVec != 0 || !Aligned16OrNull(gate_up) || !Aligned16OrNull(out)) return false;
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

bool SiluMulForward(Dtype dtype, const void* gate_up, void* out, int64_t rows, int64_t cols,
                    void* stream) {
  if (!Takes(rows, cols, gate_up, out, nullptr)) return false;
  const int64_t packs = cols / kVec;
  const int64_t blocks = GridBlocks(rows * packs, kThreads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    SiluMulForwardKernel<T><<<blocks, kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(gate_up), static_cast<T*>(out), rows, packs);
    return true;
  });
}

bool SiluMulBackward(Dtype dtype, const void* dout, const void* gate_up, void* d_gate_up,
                     int64_t rows, int64_t cols, void* stream) {
  if (!Takes(rows, cols, dout, gate_up, d_gate_up)) return false;
  const int64_t packs = cols / kVec;
  const int64_t blocks = GridBlocks(rows * packs, kThreads);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    SiluMulBackwardKernel<T><<<blocks, kThreads, 0, AsStream(stream)>>>(
        static_cast<const T*>(dout), static_cast<const T*>(gate_up), static_cast<T*>(d_gate_up),
        rows, packs);
    return true;
  });
}

}  // namespace e3::kernels
