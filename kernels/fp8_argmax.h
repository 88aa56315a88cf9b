// The kernels of the lm_head's FP8 candidate search (teacher_server/
// layers/fp8_head_argmax.h), behind a plain C++ interface as
// teacher_ops.h: no CUDA headers here, no LibTorch in the .cu file. The search: e4m3 copies
// of the hidden rows and of the head give approximate scores in one FP8
// GEMM (cuBLASLt, common/torch/gemm.h); each row's kFp8ArgmaxCandidates best
// scoring columns are then rescored exactly, in bf16 with fp32 sums, and
// the exact best of those is the answer. Launch errors are read with
// TakeLaunchError (dtype.h).
#ifndef E3_KERNELS_FP8_ARGMAX_H_
#define E3_KERNELS_FP8_ARGMAX_H_

#include <cstdint>

namespace e3::kernels {

// Columns per row that the approximate scores nominate. On random Llama-1B
// and 8B heads (the flattest logits a head gives) the exact argmax is
// outside the FP8 top 4 in 3-4 of 8192 rows and never outside the top 8
// (bench/results/2026-12-02-teacher-kernels-gemm-tuning.md).
constexpr int kFp8ArgmaxCandidates = 8;

// Per row r of bf16 x [rows, cols] (row stride x_stride elements): q[r] =
// e4m3(x[r] * 448 / max|x[r]|), round to nearest, saturating; scale[r] =
// max|x[r]| / 448 (1 for an all-zero row), so x[r] ~ q[r] * scale[r].
// `scale` may be null. A row holding a NaN or an infinity gets
// nonfinite[r] = 1 and zeros in q (else nonfinite[r] = 0). q: rows * cols
// bytes, contiguous. Requires cols % 8 == 0 and 16-byte aligned rows;
// returns false (nothing launched) otherwise.
bool QuantizeRowsE4m3(const void* x, int64_t x_stride, int64_t rows, int64_t cols, void* q, float* scale,
                      uint8_t* nonfinite, void* stream);

// Per row r of bf16 scores [rows, cols] (row stride `stride`): the
// kFp8ArgmaxCandidates columns c with the largest scores[r, c] *
// col_scale[c] (ties to the lower column), best first, into
// cand[r * kFp8ArgmaxCandidates ...]; -1 where the row has fewer columns.
// NaN scores are never nominated (an FP8 product of finite e4m3 values
// has none). Requires cols % 8 == 0 and 16-byte aligned rows.
bool TopScoreCandidates(const void* scores, int64_t rows, int64_t cols, int64_t stride, const float* col_scale,
                        int32_t* cand, void* stream);

// out[r] = the candidate column c of row r whose exact logit
// bf16(sum_k x[r, k] w[c, k]) (fp32 sum) is largest in at::argmax's order
// (a NaN first, else the larger value, else the lower column). A row with
// nonfinite[r] set scans every one of the `vocab` columns instead (slow,
// but at::argmax's answer for the NaN or infinite logits such a row
// makes). bf16 x: [rows, k], w: [vocab, k], row strides in elements,
// multiples of 8, 16-byte aligned; k % 8 == 0. With `best_logit` (may be
// null) the winner's logit as well, as a float: what a vocab-parallel rank
// compares with its peers' (a row with no candidate gets column 0, -inf).
bool RescoreCandidates(const void* x, int64_t x_stride, const void* w, int64_t w_stride, int64_t rows, int64_t vocab,
                       int64_t k, const int32_t* cand, const uint8_t* nonfinite, int32_t* out, float* best_logit,
                       void* stream);

}  // namespace e3::kernels

#endif  // E3_KERNELS_FP8_ARGMAX_H_
