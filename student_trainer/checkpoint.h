// Student checkpoints: the draft (an fp32 export: config.json +
// model.safetensors), the optimizer state, and the trainer state with the
// stream cursor. Written to a temp dir and renamed, then `latest` is
// updated, so a crash mid-write never leaves a half checkpoint as latest.
#ifndef E3_STUDENT_TRAINER_CHECKPOINT_H_
#define E3_STUDENT_TRAINER_CHECKPOINT_H_

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "student_trainer/draft_optimizer.h"
#include "student_trainer/eagle3_draft.h"
#include "student_trainer/teacher_client.h"
#include "student_trainer/state/trainer_state.h"

namespace e3 {

// Saves `<dir>/step-NNNNNNNN/` and points `<dir>/latest` at it; keeps the
// newest `keep` checkpoints. Returns the checkpoint's path.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const TrainerState& state,
                                           const Eagle3DraftImpl& draft, DraftOptimizer& optimizer,
                                           int keep = 2);

// The latest checkpoint in `dir`, if any: loads weights and optimizer state
// into the given objects and returns the trainer state.
absl::StatusOr<std::optional<TrainerState>> LoadLatestCheckpoint(const std::string& dir, Eagle3DraftImpl& draft,
                                                                 DraftOptimizer& optimizer);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_CHECKPOINT_H_
