// One training step of the student, as the trainer and its tests run it:
// the TTT forward over one batch, backward, the optimizer step (with the
// data-parallel gradient reduction) and the step's metrics, read once
// after the update (the step's one host synchronisation).
#ifndef E3_STUDENT_TRAINER_STEP_TRAIN_STEP_H_
#define E3_STUDENT_TRAINER_STEP_TRAIN_STEP_H_

#include "absl/status/statusor.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/optim/draft_optimizer.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

// `batch` null: this rank's share of a small global batch is empty; the
// step (and its all-reduce, with zero gradients) still runs, in lockstep
// with the other ranks, and its output has no loss or accuracy. `step`
// names the step in errors, which include a loss that is not finite.
absl::StatusOr<TttOutput> TrainStep(Eagle3DraftImpl& draft, DraftOptimizer& optimizer,
                                    const TeacherBatch* batch, const TttOptions& ttt, double lr,
                                    int64_t step);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_TRAIN_STEP_H_
