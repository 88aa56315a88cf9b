// Shared pieces of the standalone nvcc probes (bench/probes/*_probe.cu): error
// checks, random bf16 and e4m3 fills, event timing and a cuBLASLt plan for
// row-major y = x W^T.
#ifndef E3_BENCH_PROBES_CUDA_PROBE_UTIL_CUH_
#define E3_BENCH_PROBES_CUDA_PROBE_UTIL_CUH_

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e)); std::exit(1); } } while (0)
#define CHECK_BLAS(x) do { int st_ = static_cast<int>(x); if (st_ != 0) { std::printf("%s: status %d\n", #x, st_); std::exit(1); } } while (0)

struct Shape { const char* name; int m, n, k; };

// The teacher's GEMMs for 8192 tokens, per model: qkv, o_proj, gate_up,
// down_proj, lm_head (Llama-3.2-1B, then Llama-3.1-8B).
constexpr int kProbeTokens = 8192;
constexpr Shape kTeacherShapes[10] = {
    {"1B qkv", kProbeTokens, 3072, 2048},     {"1B o", kProbeTokens, 2048, 2048},
    {"1B gate_up", kProbeTokens, 16384, 2048}, {"1B down", kProbeTokens, 2048, 8192},
    {"1B lm_head", kProbeTokens, 128256, 2048},
    {"8B qkv", kProbeTokens, 6144, 4096},     {"8B o", kProbeTokens, 4096, 4096},
    {"8B gate_up", kProbeTokens, 28672, 4096}, {"8B down", kProbeTokens, 4096, 14336},
    {"8B lm_head", kProbeTokens, 128256, 4096},
};

// Random-looking values in [-1, 1) times `scale`: constant inputs draw less
// power and let the GPU hold higher clocks, which overstates what real
// activations get.
__global__ void FillRandom(__nv_bfloat16* p, size_t n, unsigned seed, float scale = 1.f) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16(((h & 0xffff) / 32768.f - 1.f) * scale);
  }
}

// Random e4m3 values in [-scale, scale), for the same reason.
__global__ void FillRandomE4m3(uint8_t* p, size_t n, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __nv_fp8_e4m3(((h & 0xffff) / 32768.f - 1.f) * scale).__x;
  }
}

template <typename T>
static T Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
static float TimeMs(F fn, int iters = 20) {
  fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(b);
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0; cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a); cudaEventDestroy(b);
  return ms / iters;
}

// One configuration attribute of a cuBLASLt algorithm.
template <typename T>
static T LtAlgoConfig(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written);
  return v;
}

// An algorithm's configuration, for the probes' logs (cuBLASLt's ids).
static std::string LtAlgoLabel(const cublasLtMatmulAlgo_t& a) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "id %d tile %u stages %u splitk %d red %u swz %u opt %u inner %u cluster %u",
                LtAlgoConfig<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID), LtAlgoConfig<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                LtAlgoConfig<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                LtAlgoConfig<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                LtAlgoConfig<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                LtAlgoConfig<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                LtAlgoConfig<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                unsigned(LtAlgoConfig<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)),
                unsigned(LtAlgoConfig<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)));
  return buf;
}

// `a` with each CTA swizzle and each of `clusters` (cublasLtClusterShape_t
// values) that it accepts. The caller still checks each against its problem.
static std::vector<cublasLtMatmulAlgo_t> LtAlgoVariants(const cublasLtMatmulAlgo_t& a,
                                                       const std::vector<uint16_t>& clusters) {
  std::vector<cublasLtMatmulAlgo_t> out;
  for (uint32_t swz : {0u, 1u}) {
    for (uint16_t cluster : clusters) {
      cublasLtMatmulAlgo_t v = a;
      if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof(swz)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster)) !=
              CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      out.push_back(v);
    }
  }
  return out;
}

// One shape's cuBLASLt descriptors (row-major y = x W^T as column-major
// D[n, m] = W^T(T) x) and the heuristic's candidates for it. bf16
// operands, or with `fp8` e4m3 ones with fast accumulation (the teacher's
// lm_head nomination GEMM); bf16 output either way.
struct LtPlan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulHeuristicResult_t results[16];
  int count = 0;
};

static LtPlan MakePlan(cublasLtHandle_t lt, const Shape& s, size_t workspace_bytes, bool fp8 = false) {
  LtPlan p;
  CHECK_BLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (fp8) {
    const int8_t on = 1;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
  }
  const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.la, ab, s.k, s.n, s.k));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.lb, ab, s.k, s.m, s.k));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_16BF, s.n, s.m, s.n));
  cublasLtMatmulPreference_t pref;
  CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
  CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.la, p.lb, p.lc, p.lc, pref, 16, p.results, &p.count));
  cublasLtMatmulPreferenceDestroy(pref);
  return p;
}

static void DestroyPlan(LtPlan& p) {
  cublasLtMatrixLayoutDestroy(p.la);
  cublasLtMatrixLayoutDestroy(p.lb);
  cublasLtMatrixLayoutDestroy(p.lc);
  cublasLtMatmulDescDestroy(p.desc);
}

// A cuBLASLt handle and its workspace. Run: row-major y = x W^T (+ c) with
// a plan's first algorithm, as the teacher runs it; the operands are
// untyped because the plan's layouts say what they hold (bf16, or e4m3
// for an FP8 plan, whose residual must be null).
struct Lt {
  cublasLtHandle_t handle;
  void* workspace;
  size_t workspace_bytes = size_t(32) << 20;
  Lt() {
    CHECK_BLAS(cublasLtCreate(&handle));
    CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  }
  ~Lt() {
    cudaFree(workspace);
    cublasLtDestroy(handle);
  }
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;
  LtPlan Plan(const Shape& s, bool fp8 = false) const { return MakePlan(handle, s, workspace_bytes, fp8); }
  void Run(const LtPlan& p, const void* x, const void* w, const void* c, void* y) const {
    const float alpha = 1.f, beta = c ? 1.f : 0.f;
    CHECK_BLAS(cublasLtMatmul(handle, p.desc, &alpha, w, p.la, x, p.lb, &beta, c ? c : y, p.lc, y, p.lc,
                              &p.results[0].algo, workspace, workspace_bytes, 0));
  }
};

#endif  // E3_BENCH_PROBES_CUDA_PROBE_UTIL_CUH_
