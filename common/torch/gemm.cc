#include "common/torch/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

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
// `tuned`: the choice of the kCublasLtTuned path (the installed algorithm
// where it applies), kept apart from the heuristic's.
struct ShapeKey {
  int device;
  int dtype;
  int64_t rows, out, in;
  bool bias, residual;
  int64_t align;
  bool tuned = false;
  int64_t ldw = 0;  // W's row stride (0: contiguous, as the FP8 path leaves it)
  bool operator<(const ShapeKey& o) const {
    return std::tie(device, dtype, rows, out, in, bias, residual, align, tuned, ldw) <
           std::tie(o.device, o.dtype, o.rows, o.out, o.in, o.bias, o.residual, o.align, o.tuned, o.ldw);
  }
};

// The heuristic's answer for a shape: its first algorithm, or none (the
// shape then always falls back, without asking again).
struct Choice {
  bool found = false;
  cublasLtMatmulAlgo_t algo;
};

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(LtAlgo::words), "cublasLtMatmulAlgo_t is eight words");

// An algorithm SetTunedGemmAlgo installed, and the rows it covers.
struct TunedAlgo {
  int64_t min_rows, max_rows;
  LtAlgo algo;
};

// Guards Chosen() and Tuned().
std::mutex g_mu;
std::map<ShapeKey, Choice>& Chosen() {
  static auto* chosen = new std::map<ShapeKey, Choice>();
  return *chosen;
}
std::map<GemmProblem, TunedAlgo>& Tuned() {
  static auto* tuned = new std::map<GemmProblem, TunedAlgo>();
  return *tuned;
}

// Drops the tuned path's cached choices (under g_mu), after the installed
// algorithms changed.
void ForgetTunedChoices() {
  for (auto it = Chosen().begin(); it != Chosen().end();) {
    it = it->first.tuned ? Chosen().erase(it) : std::next(it);
  }
}

cublasLtMatmulAlgo_t ToCublas(const LtAlgo& a) {
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, a.words.data(), sizeof(algo));
  return algo;
}

LtAlgo FromCublas(const cublasLtMatmulAlgo_t& algo) {
  LtAlgo a;
  std::memcpy(a.words.data(), &algo, sizeof(algo));
  return a;
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
  // `ldw`: elements between W's rows (K, or more for a column block of a
  // wider matrix); 0 means K.
  LtProblem(cudaDataType_t ab, cudaDataType_t cd_type, int64_t M, int64_t N, int64_t K, const void* bias,
            bool fast_accum = false, int64_t ldw = 0) {
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
    Check(cublasLtMatrixLayoutInit(&a, ab, K, N, ldw > 0 ? ldw : K), "layout of W");
    Check(cublasLtMatrixLayoutInit(&b, ab, K, M, K), "layout of x");
    Check(cublasLtMatrixLayoutInit(&cd, cd_type, N, M, N), "layout of y");
  }
};

// The heuristic's answers for this problem with operands aligned to
// `align` bytes and our workspace: at most `count`, best first, each one
// cuBLASLt can run.
std::vector<cublasLtMatmulAlgo_t> HeuristicAlgos(cublasLtHandle_t handle, LtProblem& p, int64_t align, int count) {
  cublasLtMatmulPreference_t pref;
  Check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const size_t workspace = kWorkspaceBytes;
  const auto align32 = static_cast<uint32_t>(align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align32, sizeof(align32));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(handle, &p.desc, &p.a, &p.b, &p.cd, &p.cd, pref, count, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; s == CUBLAS_STATUS_SUCCESS && i < found; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[static_cast<size_t>(i)];
    if (r.state == CUBLAS_STATUS_SUCCESS) algos.push_back(r.algo);
  }
  return algos;
}

// The heuristic's first choice for this problem.
Choice FirstChoice(cublasLtHandle_t handle, LtProblem& p, int64_t align) {
  const std::vector<cublasLtMatmulAlgo_t> algos = HeuristicAlgos(handle, p, align, 1);
  return algos.empty() ? Choice{} : Choice{true, algos[0]};
}

template <typename T>
T AlgoCap(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr, T otherwise) {
  T v{};
  size_t written = 0;
  return cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &v, sizeof(v), &written) == CUBLAS_STATUS_SUCCESS ? v
                                                                                                         : otherwise;
}

template <typename T>
T AlgoConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

// Whether cuBLASLt runs `algo` on problem p with operands aligned to
// `align` bytes and our workspace.
bool AlgoTakes(cublasLtHandle_t handle, LtProblem& p, const cublasLtMatmulAlgo_t& algo, int64_t align) {
  cublasLtMatmulHeuristicResult_t check;
  if (cublasLtMatmulAlgoCheck(handle, &p.desc, &p.a, &p.b, &p.cd, &p.cd, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
      check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > kWorkspaceBytes) {
    return false;
  }
  for (auto attr : {CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES}) {
    if (AlgoCap<uint32_t>(algo, attr, 256) > align) return false;
  }
  return true;
}

// The tuned path's choice: the installed algorithm where one covers the
// rows and cuBLASLt takes it for this exact shape, else the heuristic's.
Choice TunedChoice(cublasLtHandle_t handle, LtProblem& p, const ShapeKey& key, const GemmProblem& problem) {
  auto it = Tuned().find(problem);
  if (it != Tuned().end() && key.rows >= it->second.min_rows && key.rows <= it->second.max_rows) {
    const cublasLtMatmulAlgo_t algo = ToCublas(it->second.algo);
    if (AlgoTakes(handle, p, algo, key.align)) return Choice{true, algo};
  }
  return FirstChoice(handle, p, key.align);
}

// D = A B (+ beta C) for problem p, with the heuristic's choice for `key`
// (asked once per shape), or with `tuned` the tuned path's; false when
// cuBLASLt has no algorithm for it.
bool RunLt(LtProblem& p, const ShapeKey& key, const GemmProblem* tuned, const void* a, const void* b, float beta,
           const void* c, at::Tensor& d) {
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  Choice choice;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Chosen().find(key);
    if (it == Chosen().end()) {
      if (Chosen().size() >= kMaxCachedShapes) Chosen().clear();
      const Choice chosen = tuned != nullptr ? TunedChoice(handle, p, key, *tuned) : FirstChoice(handle, p, key.align);
      it = Chosen().emplace(key, chosen).first;
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
at::Tensor LtGemm(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual2,
                  bool tuned) {
  const at::ScalarType st = x2.scalar_type();
  if (!x2.is_cuda() || (st != at::kBFloat16 && st != at::kHalf)) return {};
  // W's rows may be a column block of a wider matrix (row stride >= K).
  if (w.scalar_type() != st || w.dim() != 2 || w.stride(1) != 1 || w.device() != x2.device()) return {};
  if (!x2.is_contiguous()) return {};
  const int64_t M = x2.size(0), K = x2.size(1), N = w.size(0);
  if (M == 0 || N == 0 || K == 0 || w.size(1) != K || K % 8 != 0 || N % 8 != 0) return {};
  const int64_t ldw = N == 1 ? K : w.stride(0);
  if (ldw < K || ldw % 8 != 0) return {};
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
  LtProblem p(type, type, M, N, K, bias.defined() ? bias.data_ptr() : nullptr, /*fast_accum=*/false, ldw);
  const ShapeKey key{x2.device().index(), static_cast<int>(st), M, N, K, bias.defined(), residual2.defined(), align,
                     tuned, ldw};
  const GemmProblem problem{x2.device().index(), st, N, K, bias.defined(), residual2.defined()};
  const float beta = residual2.defined() ? 1.f : 0.f;
  const void* c = residual2.defined() ? residual2.data_ptr() : y.data_ptr();
  if (!RunLt(p, key, tuned ? &problem : nullptr, w.data_ptr(), x2.data_ptr(), beta, c, y)) return {};
  return y;
}

// The name of cuBLASLt's cluster shape id (cublasLtClusterShape_t's
// first values; the rarer shapes print as their number).
std::string ClusterName(uint16_t id) {
  static const char* const kNames[] = {"auto",   "#1",    "1x1x1", "2x1x1", "4x1x1", "1x2x1",
                                       "2x2x1",  "4x2x1", "1x4x1", "2x4x1", "4x4x1", "8x1x1",
                                       "1x8x1",  "8x2x1", "2x8x1", "16x1x1", "1x16x1"};
  return id < sizeof(kNames) / sizeof(kNames[0]) ? kNames[id] : absl::StrCat("#", id);
}
#endif

}  // namespace

at::Tensor Gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual,
                GemmPath path) {
#ifdef E3_HAS_CUDA
  if (UsesCublasLt(path) && x.dim() >= 1 && x.is_contiguous()) {
    const int64_t K = x.size(-1);
    const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, K});
    const at::Tensor r2 = residual.defined() && residual.dim() != 2 ? residual.reshape({-1, residual.size(-1)})
                                                                     : residual;
    at::Tensor y = LtGemm(x2, w, bias, r2, path == GemmPath::kCublasLtTuned);
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
  if (!RunLt(p, key, nullptr, wq.data_ptr(), xq.data_ptr(), 0.f, y.data_ptr(), y)) return {};
  return y;
#else
  (void)xq;
  (void)wq;
  return at::Tensor();
#endif
}

int64_t LmHeadChunkRows(int64_t row_bytes, int64_t multiple, int64_t chunk_bytes) {
  const int64_t rows = chunk_bytes / std::max<int64_t>(1, row_bytes);
  return std::max<int64_t>(256, rows / multiple * multiple);
}

int64_t LtGemmCalls() { return g_lt_calls.load(std::memory_order_relaxed); }

bool GemmProblem::operator<(const GemmProblem& o) const {
  return std::tie(device, dtype, out, in, bias, residual) <
         std::tie(o.device, o.dtype, o.out, o.in, o.bias, o.residual);
}

bool GemmProblem::operator==(const GemmProblem& o) const { return !(*this < o) && !(o < *this); }

std::string GemmProblem::Name() const {
  return absl::StrCat(dtype == at::kBFloat16 ? "bf16" : dtype == at::kHalf ? "fp16" : c10::toString(dtype), " ", out,
                      "x", in, bias ? "+bias" : "", residual ? "+residual" : "");
}

#ifdef E3_HAS_CUDA
int64_t CublasLtVersion() { return static_cast<int64_t>(cublasLtGetVersion()); }

std::vector<LtAlgo> LtCandidates(const GemmProblem& problem, int64_t rows, int max_count) {
  std::vector<LtAlgo> out;
  if (rows <= 0 || max_count <= 0 || (problem.dtype != at::kBFloat16 && problem.dtype != at::kHalf)) return out;
  const c10::cuda::CUDAGuard guard(problem.device);
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const cudaDataType_t type = problem.dtype == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  // A dummy non-null bias pointer: the descriptor only records it.
  static const int kBiasTag = 0;
  LtProblem p(type, type, rows, problem.out, problem.in, problem.bias ? &kBiasTag : nullptr);
  const int64_t align = 256;
  // The first choice as the untuned path asks for it (one answer), then
  // the longer list.
  const Choice first = FirstChoice(handle, p, align);
  if (!first.found) return out;
  out.push_back(FromCublas(first.algo));
  for (const cublasLtMatmulAlgo_t& algo : HeuristicAlgos(handle, p, align, std::max(max_count, 16))) {
    if (static_cast<int>(out.size()) >= max_count) break;
    if (AlgoConfig<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1 ||
        AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) != CUBLASLT_REDUCTION_SCHEME_NONE) {
      continue;
    }
    const LtAlgo a = FromCublas(algo);
    if (std::find(out.begin(), out.end(), a) == out.end() && AlgoTakes(handle, p, algo, align)) out.push_back(a);
  }
  return out;
}

std::string DescribeLtAlgo(const LtAlgo& a) {
  const cublasLtMatmulAlgo_t algo = ToCublas(a);
  return absl::StrCat("algo ", AlgoConfig<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID), ", tile ",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID), ", stages ",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), ", cluster ",
                      ClusterName(AlgoConfig<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)), ", swizzle ",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), ", option ",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
}

void SetTunedGemmAlgo(const GemmProblem& problem, int64_t min_rows, int64_t max_rows, const LtAlgo& algo) {
  std::lock_guard<std::mutex> lock(g_mu);
  Tuned()[problem] = TunedAlgo{min_rows, max_rows, algo};
  ForgetTunedChoices();
}

void ClearTunedGemmAlgos() {
  std::lock_guard<std::mutex> lock(g_mu);
  Tuned().clear();
  ForgetTunedChoices();
}

void ClearTunedGemmAlgo(const GemmProblem& problem) {
  std::lock_guard<std::mutex> lock(g_mu);
  Tuned().erase(problem);
  ForgetTunedChoices();
}
#else
int64_t CublasLtVersion() { return 0; }
std::vector<LtAlgo> LtCandidates(const GemmProblem&, int64_t, int) { return {}; }
std::string DescribeLtAlgo(const LtAlgo&) { return "cuBLASLt (not in this build)"; }
void SetTunedGemmAlgo(const GemmProblem&, int64_t, int64_t, const LtAlgo&) {}
void ClearTunedGemmAlgos() {}
void ClearTunedGemmAlgo(const GemmProblem&) {}
#endif

}  // namespace e3
