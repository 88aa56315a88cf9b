// The lm_head's target argmax through an FP8 candidate search (the sgl
// backend on GPUs with FP8 tensor cores: compute capability 8.9 and up).
//
// The exact answer needs every logit x w^T: on the bench's shapes the
// lm_head GEMM is a large share of a teacher forward. FP8 tensor cores
// run it faster (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md), but e4m3 keeps 3 mantissa
// bits, so its argmax alone would be wrong for ~10% of rows. So FP8 only
// nominates: each row's 8 best scoring columns
// are rescored exactly (bf16 operands, fp32 sum, the logit rounded to
// bf16, as the exact path and at::argmax see it), and the answer is the
// exact best of them. It equals the exact argmax whenever that column is
// among the 8 nominated; on random heads, where logits are flattest, the
// exact argmax is outside the FP8 top 4 in 3-4 of 8192 rows and never
// outside the top 8. Rows whose hidden state holds a NaN or an infinity
// scan every column exactly (at::argmax's answer for them).
//
// Costs: an e4m3 copy of the head (V x H bytes: 262 MB for Llama-1B's,
// 525 MB for 8B's) and its per-row scales; per call, the [rows, V] bf16
// scores in chunks of up to 2 GiB (one chunk for 8192 rows of a 128k vocab).
#ifndef E3_TEACHER_SERVER_LAYERS_FP8_HEAD_ARGMAX_H_
#define E3_TEACHER_SERVER_LAYERS_FP8_HEAD_ARGMAX_H_

#include <cstdint>
#include <memory>

#include "common/torch/torch_core.h"

namespace e3 {

class Fp8HeadArgmax {
 public:
  // Prepares head w [V, H] (bf16, contiguous, on a CUDA device of compute
  // capability 8.9 or newer; H and V multiples of 16). Returns null where
  // the search does not apply (any other device, dtype or shape, a build
  // without CUDA) or the head holds a NaN or an infinity (the exact path
  // then keeps at::argmax's semantics for them).
  static std::unique_ptr<Fp8HeadArgmax> Prepare(const at::Tensor& w);

  // x: [rows, H] bf16 on the head's device, unit stride along H. Returns
  // the target argmax as int32 [rows], or an undefined tensor when x is
  // outside what the kernels take (the caller then runs the exact path).
  // With `best_logit`, also the winning column's exact logit per row, as
  // float [rows]: the bf16 value the logits would hold there (a
  // vocab-parallel head's ranks compare theirs to find the global argmax).
  at::Tensor Argmax(const at::Tensor& x, at::Tensor* best_logit = nullptr) const;

 private:
  Fp8HeadArgmax() = default;
  at::Tensor w_;        // the bf16 head, for the exact rescoring
  at::Tensor wq_;       // e4m3 [V, H] as bytes
  at::Tensor w_scale_;  // float [V]: row v of the head ~ wq_[v] * w_scale_[v]
};

// For tests: how many Argmax calls have run the search to the end.
int64_t Fp8HeadArgmaxCalls();

}  // namespace e3

#endif  // E3_TEACHER_SERVER_LAYERS_FP8_HEAD_ARGMAX_H_
