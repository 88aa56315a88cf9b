#include "student_trainer/checkpoint/checkpoint_manager.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "student_trainer/optim/data_parallel.h"

namespace e3 {

absl::StatusOr<OnCheckpointSaveError> ParseOnCheckpointSaveError(const std::string& text) {
  if (text == "stop") return OnCheckpointSaveError::kStop;
  if (text == "continue") return OnCheckpointSaveError::kContinue;
  return absl::InvalidArgumentError(
      absl::StrCat("--on_checkpoint_save_error: expected stop or continue, got \"", text, "\""));
}

absl::StatusOr<OnCheckpointLoadError> ParseOnCheckpointLoadError(const std::string& text) {
  if (text == "stop") return OnCheckpointLoadError::kStop;
  if (text == "start_fresh") return OnCheckpointLoadError::kStartFresh;
  return absl::InvalidArgumentError(
      absl::StrCat("--on_checkpoint_load_error: expected stop or start_fresh, got \"", text, "\""));
}

absl::StatusOr<std::optional<TrainerState>> CheckpointManager::Resume(DraftModel& trained,
                                                                      DraftOptimizer& optimizer,
                                                                      size_t teachers) {
  if (options_.dir.empty()) return std::nullopt;
  E3_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadNewestCheckpoint(options_.dir, trained, optimizer));
  const int rank = options_.layout.rank();
  for (const std::string& problem : loaded.problems) {
    std::fprintf(stderr, "student[%d]: warning: %s\n", rank, problem.c_str());
  }
  if (!loaded.state.has_value()) {
    if (loaded.problems.empty()) return std::nullopt;  // a first run: nothing to resume
    if (options_.on_load_error == OnCheckpointLoadError::kStop) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no checkpoint in ", options_.dir, " loads (", absl::StrJoin(loaded.problems, "; "),
          "); not starting from scratch over them: fix or remove them, or pass "
          "--on_checkpoint_load_error=start_fresh"));
    }
    std::fprintf(stderr,
                 "student[%d]: warning: no checkpoint in %s loads; starting from the initial draft "
                 "(--on_checkpoint_load_error=start_fresh); new checkpoints set them aside as they pass their "
                 "steps\n",
                 rank, options_.dir.c_str());
    return std::nullopt;
  }
  const TrainerState& resumed = *loaded.state;
  if (resumed.cursors.size() != teachers) {
    return absl::FailedPreconditionError(absl::StrCat(loaded.path, " holds cursors for ",
                                                      resumed.cursors.size(), " teachers, but ",
                                                      teachers, " are given"));
  }
  if (!loaded.problems.empty()) {
    std::fprintf(stderr, "student[%d]: warning: fell back to the older checkpoint %s\n", rank,
                 loaded.path.c_str());
  }
  saved_step_ = resumed.step;
  last_path_ = loaded.path;
  std::printf("student[%d]: resumed from %s at step %ld, cursor %ld:%ld\n", rank, loaded.path.c_str(),
              static_cast<long>(resumed.step), static_cast<long>(resumed.cursors[0].epoch),
              static_cast<long>(resumed.cursors[0].next_batch));
  return loaded.state;
}

absl::Status CheckpointManager::Save(const TrainerState& state, const DraftModel& trained,
                                     DraftOptimizer& optimizer, TeacherPool& teachers, bool last,
                                     bool final_report) {
  if (options_.dir.empty()) return absl::OkStatus();
  if (state.step == saved_step_ && !saved_ok_) {
    return absl::OkStatus();  // this step's save failed (continue): nothing to commit, not retried
  }
  if (state.step != saved_step_) {
    saved_step_ = state.step;
    saved_ok_ = false;
    absl::Status written = absl::OkStatus();
    if (options_.layout.is_first()) {
      absl::StatusOr<std::string> path =
          SaveCheckpoint(options_.dir, state, trained, optimizer, options_.keep);
      if (path.ok()) {
        last_path_ = *path;
      } else {
        written = path.status();
      }
    }
    // Every rank learns rank 0's outcome, so that all commit, go on or stop together.
    E3_ASSIGN_OR_RETURN(const bool saved, AgreeWithRank0(options_.group, options_.device, written.ok()));
    // Not saved: nothing is committed.
    if (!saved) return Failed(state.step, written);
    saved_ok_ = true;
  }
  // Only now are the batches before each cursor committed.
  return teachers.Commit(state.cursors, last, final_report);
}

absl::Status CheckpointManager::Failed(int64_t step, const absl::Status& written) {
  const std::string what =
      options_.layout.is_first() ? std::string(written.message())
                         : absl::StrCat("rank 0 could not write the checkpoint of step ", step);
  const std::string kept = last_path_.empty() ? std::string("no earlier checkpoint of this run")
                                              : absl::StrCat("the newest checkpoint is still ", last_path_);
  if (options_.on_save_error == OnCheckpointSaveError::kStop) {
    return absl::Status(written.ok() ? absl::StatusCode::kDataLoss : written.code(),
                        absl::StrCat(what, "; ", kept, "; stopping (--on_checkpoint_save_error=stop)"));
  }
  ++failures_;
  std::fprintf(stderr,
               "student[%d]: warning: %s; %s; training goes on (--on_checkpoint_save_error=continue), "
               "the batches since it stay uncommitted\n",
               options_.layout.rank(), what.c_str(), kept.c_str());
  return absl::OkStatus();
}

}  // namespace e3
