// The blocks a DFlash step trains on one packed batch: anchors drawn among
// the supervised rows, each block's tokens [anchor, MASK x (B - 1)] and
// each drafted row's label.
//
// An anchor is a row whose token and next token (in the same sample) are
// both supervised, as SpecForge samples them; at most num_anchors of them,
// drawn without replacement from `draw` (a seed the caller varies by step),
// in ascending order. Row k of the block at anchor a predicts the token at
// a + k; its label is -1 (no loss) past its sample's end or where that
// token is not supervised.
#ifndef E3_STUDENT_TRAINER_STEP_DFLASH_BLOCKS_H_
#define E3_STUDENT_TRAINER_STEP_DFLASH_BLOCKS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/dflash_draft.h"
#include "student_trainer/feed/teacher_batch.h"

namespace e3 {

// What a drafted row learns.
enum class DFlashLabels {
  kTargetArgmax,  // the target's own greedy token, which the teacher sends: no regenerated data needed
  kInputIds,      // the data's token, as SpecForge trains (on data the target regenerated)
  // The target's whole distribution there (knowledge distillation from its
  // last hidden state and full head); `labels` hold its argmax.
  kTargetDistribution,
};

struct DFlashBlockOptions {
  int64_t block_size = 16;
  int64_t num_anchors = 512;
  int64_t mask_token_id = -1;
  DFlashLabels labels = DFlashLabels::kTargetArgmax;
};

struct DFlashBlockBatch {
  DFlashBlocks blocks;
  at::Tensor block_tokens;  // [nB * B] int64 on the host: anchor token, then the mask token
  at::Tensor labels;        // [nB * B] int64 on the host, -1 where a row has none
  // [nB * B] int64 on the host: the packed row whose target prediction is
  // each row's token (a + k - 1 for row k of the block at a), 0 where the
  // label is -1.
  at::Tensor source_rows;
};

// Errors name the batch field whose shape does not fit.
absl::StatusOr<DFlashBlockBatch> PlanDFlashBlocks(const TeacherBatch& batch, const DFlashBlockOptions& options,
                                                  uint64_t draw);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_DFLASH_BLOCKS_H_
