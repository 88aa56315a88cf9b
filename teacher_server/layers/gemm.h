// The projections' GEMM: y = x W^T (+ bias) (+ residual), with W in
// nn.Linear's [out, in] layout.
//
// The hf backend uses LibTorch's matmul (kAten). The sgl backend calls
// cuBLASLt itself (kCublasLt) so that the residual add happens in the
// GEMM's epilogue: D = X W^T + H with C != D, which saves the next norm a
// read and a write of the hidden state (1B shape on an H200: +1.7% per
// dense forward, +2.8% on ragged chat batches, bench/README.md section
// 8). The sum is then rounded once, from fp32, instead of twice: closer
// to the exact sum than transformers'.
// The algorithm is cuBLASLt's heuristic first choice for the exact shape,
// so every run makes the same choice. (Timing the heuristic's candidates
// per shape was tried and dropped: the isolated winners, up to 14% faster
// alone, gave 0-3% in a forward's sequence of GEMMs, and a timed pick can
// differ between runs.)
// Anything cuBLASLt does not take (CPU, fp32, unaligned or non-contiguous
// operands, sizes not a multiple of 8, a build without CUDA) runs
// at::linear plus the add: the same work as the norm doing the add, and
// the CPU suite exercises the same control flow.
#ifndef E3_TEACHER_SERVER_LAYERS_GEMM_H_
#define E3_TEACHER_SERVER_LAYERS_GEMM_H_

#include <torch/torch.h>

#include <cstdint>

namespace e3 {

enum class GemmPath {
  kAten,      // at::linear (cuBLAS's default algorithm), then the residual add
  kCublasLt,  // cuBLASLt with the residual in the epilogue, where it applies
};

// x: [..., in]; w: [out, in]; bias: [out] or undefined; residual: x's
// shape with `out` features, or undefined. Returns a new tensor (the
// residual is read, never written).
at::Tensor Gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual,
                GemmPath path);

// Rows of a [rows, N] lm_head product (logits or FP8 scores) computed at
// once, for rows of `row_bytes` each: about 1 GiB at a time, so the whole
// product never needs to exist for long batches while the GEMMs stay
// large; at least 256 rows, rounded down to a multiple of `multiple`.
int64_t LmHeadChunkRows(int64_t row_bytes, int64_t multiple = 1);

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

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_GEMM_H_
