// The reference TTT step: the semantics of ttt_step.h written as the plain
// LibTorch op sequence, step by step as SpecForge's training forward runs
// them. It is the definition the fast step (fast_step.h) is tested
// against, and `students.kernels: reference` trains with it.
#ifndef E3_STUDENT_TRAINER_STEP_REFERENCE_STEP_H_
#define E3_STUDENT_TRAINER_STEP_REFERENCE_STEP_H_

#include "absl/status/statusor.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

// RunTtt with TttKernels::kReference lands here; the same contract.
absl::StatusOr<TttOutput> RunTttReference(Eagle3DraftImpl& draft, const TeacherBatch& batch,
                                          const TttOptions& options);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STEP_REFERENCE_STEP_H_
