#include "student_trainer/checkpoint_manager.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "student_trainer/data_parallel.h"

namespace e3 {

absl::StatusOr<std::optional<TrainerState>> CheckpointManager::Resume(Eagle3DraftImpl& trained,
                                                                      DraftOptimizer& optimizer,
                                                                      size_t teachers) {
  if (options_.dir.empty()) return std::nullopt;
  E3_ASSIGN_OR_RETURN(std::optional<TrainerState> resumed,
                      LoadLatestCheckpoint(options_.dir, trained, optimizer));
  if (!resumed.has_value()) return std::nullopt;
  if (resumed->cursors.size() != teachers) {
    return absl::FailedPreconditionError(absl::StrCat(options_.dir, " holds cursors for ",
                                                      resumed->cursors.size(), " teachers, but ",
                                                      teachers, " are given"));
  }
  saved_step_ = resumed->step;
  std::printf("student[%d]: resumed from %s at step %ld, cursor %ld:%ld\n", options_.rank,
              options_.dir.c_str(), static_cast<long>(resumed->step),
              static_cast<long>(resumed->cursors[0].epoch),
              static_cast<long>(resumed->cursors[0].next_batch));
  return resumed;
}

absl::Status CheckpointManager::Save(const TrainerState& state, const Eagle3DraftImpl& trained,
                                     DraftOptimizer& optimizer, TeacherPool& teachers, bool last,
                                     bool final_report) {
  if (options_.dir.empty()) return absl::OkStatus();
  if (state.step != saved_step_) {
    saved_step_ = state.step;
    if (options_.rank == 0) {
      E3_ASSIGN_OR_RETURN(last_path_, SaveCheckpoint(options_.dir, state, trained, optimizer));
    }
    E3_RETURN_IF_ERROR(Barrier(options_.group, options_.device));
  }
  // Only now are the batches before each cursor committed.
  return teachers.Commit(state.cursors, last, final_report);
}

}  // namespace e3
