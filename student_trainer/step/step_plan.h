// The fast TTT step's plan: which rows every step runs and trains, with
// their shifts, masks and targets, computed on the host from host copies
// of the batch's [T] tensors and uploaded in one copy, so that nothing
// inside the step waits for the device (fast_step.h).
//
// The host plans while the GPU runs the work that needs no plan (the
// target distribution and fc). Where planning takes longer than that
// work, the GPU idles, so both the plan and its upload are kept cheap:
// the plan is written into one vector in its upload order, and the
// upload goes through a pinned buffer kept between steps (pinning a new
// buffer per step cost milliseconds at 16k tokens).
#ifndef E3_STUDENT_TRAINER_STEP_STEP_PLAN_H_
#define E3_STUDENT_TRAINER_STEP_STEP_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/ops/draft_head_loss.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

// What the plan reads of the batch, on the host.
struct TttHostBatch {
  at::Tensor ids, top, mask;  // int64 [T], int64 [T], bool [T]
};

// The plan's inputs: the host batch and cu_seqlens.
struct TttPlanInputs {
  TttHostBatch batch;
  std::vector<int64_t> cu;
};

// The plan's inputs on their way to the host. The constructor queues their
// copies (input_ids, target_argmax, loss_mask, cu_seqlens) into pinned
// memory on the batch's device, waiting for nothing, so the step queues the work that
// needs no plan behind them and the host plans while the GPU runs it;
// fields already on the host are taken as they are. Finish waits for the
// copies alone (not for the work queued after them) and checks cu_seqlens
// and the ids' range (InvalidArgument names the field). The batch's shapes
// must have passed CheckTttBatchShapes.
class TttPlanInputsDownload {
 public:
  explicit TttPlanInputsDownload(const TeacherBatch& batch);
  absl::StatusOr<TttPlanInputs> Finish(const Eagle3DraftImpl& draft);

 private:
  at::Tensor ids_, top_, mask_, cu_;  // host tensors (pinned ones filling)
  std::optional<at::Device> staged_on_;
};

// The plan on the host.
struct TttPlan {
  int64_t tokens = 0, length = 0, pad_rows = 0;
  std::vector<int64_t> cu;
  // int64 upload: [T + pad_rows] ids (the padding rows hold id 0); per
  // step the row of the once-normalised embeddings each midlayer row reads
  // (distinct within a step: a sample's positions past its end read
  // padding rows of their own); [T] positions; per step the head rows
  // (indices into the step's midlayer rows) and their target rows; per
  // compacted step its midlayer rows' positions and their indices among
  // the previous step's rows; per step its loss and position token
  // counts; cu_seqlens.
  std::vector<int64_t> longs;
  std::vector<double> row_weights;  // per step, one per head row
  std::vector<int64_t> head_rows;   // per step: how many
  std::vector<int64_t> head_first_row;  // per step: the first where they are a range, else -1
  std::vector<int64_t> mid_rows;    // per step: how many rows its midlayer runs over
  std::vector<int64_t> embed_first_row;  // per step: the first embedding row where they are a range, else -1
  std::vector<int64_t> loss_tokens, position_tokens;
  bool compacted(int64_t step) const { return mid_rows[step] < tokens; }
};

// `t2d[v]` != 0 where target token v is in the draft vocab; `cu` the
// samples' cumulative lengths.
TttPlan MakeTttPlan(const std::vector<uint8_t>& t2d, const TttHostBatch& batch, std::vector<int64_t> cu,
                    const TttOptions& options);

// The plan on the device, as views of the uploaded buffer.
struct TttDevicePlan {
  at::Tensor ext_ids;                  // [T + pad_rows]
  std::vector<at::Tensor> embed_rows;  // per step, one per midlayer row
  std::vector<int64_t> embed_first_row;  // TttPlan's
  at::Tensor positions;                // [T]
  std::vector<ops::HeadStepRows> head;
  // Compacted steps (undefined elsewhere): the midlayer rows' positions
  // and their indices among the previous step's rows.
  std::vector<at::Tensor> mid_positions, mid_from_prev;
  at::Tensor counts;      // [L, 2] loss and position tokens
  at::Tensor cu_seqlens;  // [B + 1]
};

// Row weights in `weight_type`; step j's weight step_weight^j. On the CPU
// the views are of host tensors.
TttDevicePlan UploadTttPlan(const TttPlan& plan, const at::Device& device, at::ScalarType weight_type,
                            double step_weight);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_STEP_PLAN_H_
