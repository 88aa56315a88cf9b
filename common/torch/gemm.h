// The projections' GEMM: y = x W^T (+ bias) (+ residual), with W in
// nn.Linear's [out, in] layout.
//
// The hf backend uses LibTorch's matmul (kAten). The sgl backend calls
// cuBLASLt itself (kCublasLt) so that the residual add happens in the
// GEMM's epilogue: D = X W^T + H with C != D, which saves the next norm a
// read and a write of the hidden state (bench/results/2026-12-01-teacher-ablation-cuda-graphs.md). The
// sum is then rounded once, from fp32, instead of twice: closer to the
// exact sum than transformers'.
// The algorithm is cuBLASLt's heuristic first choice for the exact shape,
// or, on the kCublasLtTuned path, the one the sequence tuner
// (gemm_tuning.h) installed for the shape. (A shape's candidates timed
// alone are no guide: their gains vanish in a forward's sequence of
// GEMMs. The tuner judges candidates by the whole sequence's time, and
// admits only those that give the first choice's bits, so a pick changes
// speed only.)
// The student's fast TTT step (student_trainer/ops/linear.h) uses it for
// its residual GEMMs too: at::addmm would first copy the residual into its
// output, a read and a write of every output element.
// Anything cuBLASLt does not take (CPU, fp32, unaligned or non-contiguous
// operands, sizes not a multiple of 8, a build without CUDA) runs
// at::linear plus the add: the same work as the norm doing the add, and
// the CPU suite exercises the same control flow. W may be a column block
// of a wider matrix (rows `stride(0)` elements apart, a multiple of 8).
#ifndef E3_COMMON_TORCH_GEMM_H_
#define E3_COMMON_TORCH_GEMM_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/torch/torch_core.h"

namespace e3 {

enum class GemmPath {
  kAten,      // at::linear (cuBLAS's default algorithm), then the residual add
  kCublasLt,  // cuBLASLt with the residual in the epilogue, where it applies
  // kCublasLt, with the algorithm SetTunedGemmAlgo installed for the
  // problem where one covers the rows (else the heuristic's first choice).
  kCublasLtTuned,
};

// Both cuBLASLt paths.
inline bool UsesCublasLt(GemmPath path) { return path == GemmPath::kCublasLt || path == GemmPath::kCublasLtTuned; }

// x: [..., in]; w: [out, in]; bias: [out] or undefined; residual: x's
// shape with `out` features, or undefined. Returns a new tensor (the
// residual is read, never written).
at::Tensor Gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual,
                GemmPath path);

// Rows of a [rows, N] lm_head product (logits or FP8 scores) computed at
// once, for rows of `row_bytes` each: about `chunk_bytes` (1 GiB unless
// given) at a time, so the whole product never needs to exist for long
// batches while the GEMMs stay large; at least 256 rows, rounded down to a
// multiple of `multiple`.
int64_t LmHeadChunkRows(int64_t row_bytes, int64_t multiple = 1, int64_t chunk_bytes = int64_t{1} << 30);

// Approximate scores for the lm_head's FP8 candidate search
// (fp8_head_argmax.h): y[M, N] = xq[M, K] wq[N, K]^T for e4m3 values stored
// as bytes (kByte tensors, contiguous), unscaled, summed by cuBLASLt's FP8
// kernels with fast accumulation (the tensor cores' own accumulator, not
// promoted to fp32 every few steps: a small error next to e4m3's own, and
// faster), stored as bf16. Returns an undefined tensor where cuBLASLt does
// not take it: no CUDA, a device below compute capability 8.9, K or N not a
// multiple of 16, pointers aligned to less than 16 bytes.
at::Tensor GemmE4m3(const at::Tensor& xq, const at::Tensor& wq);

// For tests: the cuBLASLt GEMMs this process has run.
int64_t LtGemmCalls();

// --- Algorithm choice, for the sequence tuner (gemm_tuning.h) ---

// What one algorithm choice covers: a projection's shape, all but its rows.
struct GemmProblem {
  int device = 0;
  at::ScalarType dtype = at::kBFloat16;
  int64_t out = 0, in = 0;  // W is [out, in]
  bool bias = false, residual = false;
  bool operator<(const GemmProblem& o) const;
  bool operator==(const GemmProblem& o) const;
  // "bf16 28672x4096", with "+bias" / "+residual".
  std::string Name() const;
};

// A cuBLASLt algorithm: cublasLtMatmulAlgo_t's eight words, which cuBLASLt
// documents as safe to store and restore under the same library version.
struct LtAlgo {
  std::array<uint64_t, 8> words{};
  bool operator==(const LtAlgo& o) const { return words == o.words; }
};

// cuBLASLt's version (cublasLtGetVersion), 0 in builds without CUDA.
int64_t CublasLtVersion();

// Algorithms for `problem` at `rows` rows on its device: the heuristic's
// first choice (what kCublasLt runs) first, then the heuristic's other
// candidates in its order, at most `max_count` in all, none that splits
// the sum over K (so each output element is summed in the same order,
// which gemm_tuning.cc then checks bit for bit). Empty without CUDA or
// where cuBLASLt has no algorithm.
std::vector<LtAlgo> LtCandidates(const GemmProblem& problem, int64_t rows, int max_count);

// The algorithm's configuration, for logs: "algo 66, tile 201, stages 35,
// cluster 1x2x1, swizzle 0, option 2" (cuBLASLt's ids: the tile and stage
// numbers are cublasLtMatmulTile_t's and cublasLtMatmulStages_t's values).
std::string DescribeLtAlgo(const LtAlgo& algo);

// From now on kCublasLtTuned runs `algo` for `problem` at row counts in
// [min_rows, max_rows] (replacing what was installed for the problem);
// shapes it does not take fall back to the heuristic. Thread-safe.
void SetTunedGemmAlgo(const GemmProblem& problem, int64_t min_rows, int64_t max_rows, const LtAlgo& algo);
// Forgets every installed algorithm (or only the problem's).
void ClearTunedGemmAlgos();
void ClearTunedGemmAlgo(const GemmProblem& problem);

}  // namespace e3

#endif  // E3_COMMON_TORCH_GEMM_H_
