#include "teacher_server/layers/gemm.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#ifdef E3_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#include "common/gpu/cuda_runtime.h"
#endif

namespace e3 {
namespace {

std::atomic<int64_t> g_lt_calls{0};

at::Tensor AtenGemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual) {
  at::Tensor y = bias.defined() ? at::linear(x, w, bias) : at::linear(x, w);
  return residual.defined() ? residual + y : y;
}

#ifdef E3_HAS_CUDA
// cuBLASLt's workspace; split-K algorithms use it.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Chosen algorithms kept at most; past that the cache starts over (a
// re-query gives the same choice, so this costs only host time).
constexpr size_t kMaxCachedShapes = 4096;

// The alignment cuBLASLt may assume for a pointer: the largest power of
// two (up to 256) that divides its address.
int64_t Alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// Everything the heuristic's choice depends on: the choice is a function
// of the shape alone, whatever batches came before.
struct ShapeKey {
  int device;
  int dtype;
  int64_t rows, out, in;
  bool bias, residual;
  int64_t align;
  bool operator<(const ShapeKey& o) const {
    return std::tie(device, dtype, rows, out, in, bias, residual, align) <
           std::tie(o.device, o.dtype, o.rows, o.out, o.in, o.bias, o.residual, o.align);
  }
};

// The heuristic's answer for a shape: its first algorithm, or none (the
// shape then always falls back, without asking again).
struct Choice {
  bool found = false;
  cublasLtMatmulAlgo_t algo;
};

std::mutex g_mu;
std::map<ShapeKey, Choice>& Chosen() {
  static auto* chosen = new std::map<ShapeKey, Choice>();
  return *chosen;
}

void Check(cublasStatus_t s, const char* what) {
  TORCH_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, ": ", cublasLtGetStatusString(s));
}

// One problem's descriptors, built on the stack (no allocation): row-major
// y[M, N] = x[M, K] W[N, K]^T is, column-major, D[N, M] = W^T(T) * x, so A
// is W seen as K x N with TRANSA, B is x seen as K x M, C and D are N x M.
// `ab` is the operands' type, `cd` the output's.
struct LtProblem {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t a, b, cd;
  LtProblem(cudaDataType_t ab, cudaDataType_t cd_type, int64_t M, int64_t N, int64_t K, const void* bias,
            bool fast_accum = false) {
    Check(cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    Check(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "transa");
    Check(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)), "transb");
    if (bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      Check(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
            "bias epilogue");
      Check(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
            "bias pointer");
    }
    if (fast_accum) {
      const int8_t on = 1;
      Check(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)), "fast accum");
    }
    Check(cublasLtMatrixLayoutInit(&a, ab, K, N, K), "layout of W");
    Check(cublasLtMatrixLayoutInit(&b, ab, K, M, K), "layout of x");
    Check(cublasLtMatrixLayoutInit(&cd, cd_type, N, M, N), "layout of y");
  }
};

// The heuristic's first choice for this problem.
Choice FirstChoice(cublasLtHandle_t handle, LtProblem& p, int64_t align) {
  cublasLtMatmulPreference_t pref;
  Check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const size_t workspace = kWorkspaceBytes;
  const auto align32 = static_cast<uint32_t>(align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align32, sizeof(align32));
  }
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(handle, &p.desc, &p.a, &p.b, &p.cd, &p.cd, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  Choice c;
  if (s != CUBLAS_STATUS_SUCCESS || found < 1 || result.state != CUBLAS_STATUS_SUCCESS) return c;
  c.found = true;
  c.algo = result.algo;
  return c;
}

// D = A B (+ beta C) for problem p, with the heuristic's choice for `key`
// (asked once per shape); false when cuBLASLt has no algorithm for it.
bool RunLt(LtProblem& p, const ShapeKey& key, const void* a, const void* b, float beta, const void* c, at::Tensor& d) {
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  Choice choice;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Chosen().find(key);
    if (it == Chosen().end()) {
      if (Chosen().size() >= kMaxCachedShapes) Chosen().clear();
      it = Chosen().emplace(key, FirstChoice(handle, p, key.align)).first;
    }
    choice = it->second;
  }
  if (!choice.found) return false;
  // From LibTorch's caching allocator, so the per-call cost is a lookup.
  at::Tensor workspace = at::empty({static_cast<int64_t>(kWorkspaceBytes)}, d.options().dtype(at::kByte));
  const float alpha = 1.f;
  const cublasStatus_t s = cublasLtMatmul(handle, &p.desc, &alpha, a, &p.a, b, &p.b, &beta, c, &p.cd, d.data_ptr(),
                                          &p.cd, &choice.algo, workspace.data_ptr(), kWorkspaceBytes,
                                          at::cuda::getCurrentCUDAStream(d.device().index()).stream());
  Check(s, "matmul");
  g_lt_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// y = x W^T (+ bias) (+ residual) through cuBLASLt, or an undefined tensor
// when the operands are outside what this path takes.
at::Tensor LtGemm(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual2) {
  const at::ScalarType st = x2.scalar_type();
  if (!x2.is_cuda() || (st != at::kBFloat16 && st != at::kHalf)) return {};
  if (w.scalar_type() != st || w.dim() != 2 || !w.is_contiguous() || w.device() != x2.device()) return {};
  if (!x2.is_contiguous()) return {};
  const int64_t M = x2.size(0), K = x2.size(1), N = w.size(0);
  if (M == 0 || N == 0 || K == 0 || w.size(1) != K || K % 8 != 0 || N % 8 != 0) return {};
  if (bias.defined() && (bias.scalar_type() != st || bias.dim() != 1 || bias.size(0) != N || !bias.is_contiguous() ||
                         bias.device() != x2.device())) {
    return {};
  }
  if (residual2.defined() && (residual2.scalar_type() != st || residual2.sizes() != at::IntArrayRef{M, N} ||
                              !residual2.is_contiguous() || residual2.device() != x2.device())) {
    return {};
  }
  const c10::cuda::CUDAGuard guard(x2.device());
  at::Tensor y = at::empty({M, N}, x2.options());
  int64_t align = std::min(Alignment(x2.data_ptr()), std::min(Alignment(w.data_ptr()), Alignment(y.data_ptr())));
  if (residual2.defined()) align = std::min(align, Alignment(residual2.data_ptr()));
  if (bias.defined()) align = std::min(align, Alignment(bias.data_ptr()));
  if (align < 16) return {};
  const cudaDataType_t type = st == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  LtProblem p(type, type, M, N, K, bias.defined() ? bias.data_ptr() : nullptr);
  const ShapeKey key{x2.device().index(), static_cast<int>(st), M, N, K, bias.defined(), residual2.defined(), align};
  const float beta = residual2.defined() ? 1.f : 0.f;
  const void* c = residual2.defined() ? residual2.data_ptr() : y.data_ptr();
  if (!RunLt(p, key, w.data_ptr(), x2.data_ptr(), beta, c, y)) return {};
  return y;
}
#endif

}  // namespace

at::Tensor Gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual,
                GemmPath path) {
#ifdef E3_HAS_CUDA
  if (path == GemmPath::kCublasLt && x.dim() >= 1 && x.is_contiguous()) {
    const int64_t K = x.size(-1);
    const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, K});
    const at::Tensor r2 = residual.defined() && residual.dim() != 2 ? residual.reshape({-1, residual.size(-1)})
                                                                     : residual;
    at::Tensor y = LtGemm(x2, w, bias, r2);
    if (y.defined()) {
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = w.size(0);
      return x.dim() == 2 ? y : y.view(shape);
    }
  }
#endif
  (void)path;
  return AtenGemm(x, w, bias, residual);
}

at::Tensor GemmE4m3(const at::Tensor& xq, const at::Tensor& wq) {
#ifdef E3_HAS_CUDA
  if (!xq.is_cuda() || xq.scalar_type() != at::kByte || wq.scalar_type() != at::kByte || xq.dim() != 2 ||
      wq.dim() != 2 || !xq.is_contiguous() || !wq.is_contiguous() || xq.device() != wq.device()) {
    return {};
  }
  const int64_t M = xq.size(0), K = xq.size(1), N = wq.size(0);
  if (M == 0 || N == 0 || K == 0 || wq.size(1) != K || K % 16 != 0 || N % 16 != 0) return {};
  const int index = xq.device().index();
  if (CudaComputeCapability(index) < 89) return {};  // FP8 tensor cores: Ada and Hopper on
  const c10::cuda::CUDAGuard guard(xq.device());
  at::Tensor y = at::empty({M, N}, xq.options().dtype(at::kBFloat16));
  const int64_t align = std::min(Alignment(xq.data_ptr()), std::min(Alignment(wq.data_ptr()), Alignment(y.data_ptr())));
  if (align < 16) return {};
  LtProblem p(CUDA_R_8F_E4M3, CUDA_R_16BF, M, N, K, nullptr, /*fast_accum=*/true);
  // dtype -1: no ScalarType's value, so FP8 problems never share a choice.
  const ShapeKey key{index, -1, M, N, K, false, false, align};
  if (!RunLt(p, key, wq.data_ptr(), xq.data_ptr(), 0.f, y.data_ptr(), y)) return {};
  return y;
#else
  (void)xq;
  (void)wq;
  return at::Tensor();
#endif
}

int64_t LmHeadChunkRows(int64_t row_bytes, int64_t multiple) {
  constexpr int64_t kChunkBytes = int64_t{1} << 30;
  const int64_t rows = kChunkBytes / std::max<int64_t>(1, row_bytes);
  return std::max<int64_t>(256, rows / multiple * multiple);
}

int64_t LtGemmCalls() { return g_lt_calls.load(std::memory_order_relaxed); }

}  // namespace e3
