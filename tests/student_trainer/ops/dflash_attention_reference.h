// The plain formulation of DFlash's block attention, for the tests of
// ops/dflash_block_attention.h: every query row against every context and
// block row, one softmax over a materialised mask, in the inputs' dtype
// (fp64 for references), with autograd's backward.
#ifndef E3_TESTS_STUDENT_TRAINER_OPS_DFLASH_ATTENTION_REFERENCE_H_
#define E3_TESTS_STUDENT_TRAINER_OPS_DFLASH_ATTENTION_REFERENCE_H_

#include <cmath>
#include <limits>

#include "common/torch/torch_core.h"
#include "student_trainer/ops/dflash_block_attention.h"

namespace e3::testing {

inline at::Tensor PlainDFlashAttention(const ops::DFlashAttentionBlocks& blocks, const at::Tensor& q,
                                       const at::Tensor& k_ctx, const at::Tensor& v_ctx, const at::Tensor& k_blk,
                                       const at::Tensor& v_blk) {
  const int64_t B = blocks.block_size, R = q.size(0), T = k_ctx.size(0), g = q.size(1) / k_ctx.size(1);
  at::Tensor allow = torch::zeros({R, T + R}, torch::kBool);
  for (int64_t i = 0; i < blocks.num_blocks(); ++i) {
    const int64_t begin = blocks.context_begin[i], end = blocks.context_end[i];
    if (end > begin) allow.narrow(0, i * B, B).narrow(1, begin, end - begin).fill_(true);
    allow.narrow(0, i * B, B).narrow(1, T + i * B, B).fill_(true);
  }
  const at::Tensor k = torch::cat({k_ctx, k_blk}).repeat_interleave(g, 1).transpose(0, 1);  // [Hq, keys, D]
  const at::Tensor v = torch::cat({v_ctx, v_blk}).repeat_interleave(g, 1).transpose(0, 1);
  at::Tensor s = torch::matmul(q.transpose(0, 1), k.transpose(1, 2)) / std::sqrt(static_cast<double>(q.size(2)));
  s = s.masked_fill(allow.to(q.device()).logical_not().unsqueeze(0), -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(s, -1), v).transpose(0, 1);
}

}  // namespace e3::testing

#endif  // E3_TESTS_STUDENT_TRAINER_OPS_DFLASH_ATTENTION_REFERENCE_H_
