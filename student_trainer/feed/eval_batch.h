// One batch of the teacher's eval set: prompts with their continuations and
// the target's aux features, which the acceptance measurement drafts from.
#ifndef E3_STUDENT_TRAINER_FEED_EVAL_BATCH_H_
#define E3_STUDENT_TRAINER_FEED_EVAL_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"

namespace e3 {

// One eval batch from the teacher, on the host.
struct EvalBatch {
  at::Tensor input_ids;                 // [T] int64: prompt + continuation, packed
  std::vector<int64_t> cu_seqlens;      // [B + 1]
  std::vector<int64_t> prompt_lengths;  // [B], each in [1, n_b)
  at::Tensor aux_hidden;                // [T, num_aux * H_target]
  int64_t tokens() const { return cu_seqlens.back(); }
};

// From the teacher's wire form: loss_mask is 1 exactly on each sample's
// continuation, which follows its prompt. DataLoss naming what is wrong.
absl::StatusOr<EvalBatch> EvalBatchFromWire(at::Tensor input_ids, at::Tensor cu_seqlens, at::Tensor loss_mask,
                                            at::Tensor aux_hidden);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_FEED_EVAL_BATCH_H_
