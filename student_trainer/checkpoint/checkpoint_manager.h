// When and how the trainer checkpoints (checkpoint.h holds the format):
// every `every` steps and at the end, never twice at one step. Rank 0
// writes (ranks step in lockstep, so its weights, optimizer and cursors
// are every rank's); every rank then learns whether it succeeded and only
// then reports the checkpoint's cursors to the teachers as committed
// (DESIGN.md "exactly once into the weights that survive").
//
// What a failure does is the user's choice, never silent:
// - a checkpoint that cannot be written (a full disk) stops the run, or,
//   with `on_save_error` kContinue, is reported and training goes on (its
//   cursors stay uncommitted; the next checkpoint that is written commits
//   them);
// - a checkpoint directory in which no checkpoint loads stops the run, or,
//   with `on_load_error` kStartFresh, training starts from the initial
//   draft (a newer checkpoint that does not load is always skipped for the
//   next older one, with a warning).
#ifndef E3_STUDENT_TRAINER_CHECKPOINT_CHECKPOINT_MANAGER_H_
#define E3_STUDENT_TRAINER_CHECKPOINT_CHECKPOINT_MANAGER_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/parallel_layout.h"
#include "common/torch/process_group.h"
#include "student_trainer/checkpoint/checkpoint.h"
#include "student_trainer/feed/teacher_pool.h"

namespace e3 {

enum class OnCheckpointSaveError { kStop, kContinue };
enum class OnCheckpointLoadError { kStop, kStartFresh };

// "stop" / "continue" and "stop" / "start_fresh"; errors name the flag.
absl::StatusOr<OnCheckpointSaveError> ParseOnCheckpointSaveError(const std::string& text);
absl::StatusOr<OnCheckpointLoadError> ParseOnCheckpointLoadError(const std::string& text);

struct CheckpointManagerOptions {
  std::string dir;  // empty: no checkpoints and no resume
  int64_t every = 100;
  int keep = kMinKeepCheckpoints;
  OnCheckpointSaveError on_save_error = OnCheckpointSaveError::kStop;
  OnCheckpointLoadError on_load_error = OnCheckpointLoadError::kStop;
  ParallelLayout layout;  // the data-parallel ranks; the first writes
  ProcessGroup* group = nullptr;  // data parallelism; null for one rank
  at::Device device = at::kCPU;   // where the agreement's tensor lives
};

class CheckpointManager {
 public:
  explicit CheckpointManager(CheckpointManagerOptions options) : options_(std::move(options)) {}

  // Loads the newest loadable checkpoint into `trained` and `optimizer`, if
  // there is one; it must hold a cursor for each of `teachers`.
  absl::StatusOr<std::optional<TrainerState>> Resume(DraftModel& trained,
                                                     DraftOptimizer& optimizer, size_t teachers);
  // Whether step `step` (just finished) is a periodic checkpoint.
  bool Due(int64_t step) const { return options_.every > 0 && step % options_.every == 0; }
  // Writes `state` (unless this step is already saved), agrees with every
  // rank on the outcome, then commits the cursors at the teachers; the
  // `last` save waits until every teacher has the commit (one away may come
  // back). A `final_report` (the student stops on a signal) sends its
  // cursors even when a teacher has them already: a draining teacher waits
  // for it. A failed write is an error, or with kContinue a warning and OK
  // (nothing committed).
  absl::Status Save(const TrainerState& state, const DraftModel& trained,
                    DraftOptimizer& optimizer, TeacherPool& teachers, bool last = false,
                    bool final_report = false);
  // The newest checkpoint on disk that this run wrote or resumed from
  // (empty: none).
  const std::string& last_path() const { return last_path_; }
  // Checkpoints that could not be written (kContinue).
  int64_t failures() const { return failures_; }

 private:
  absl::Status Failed(int64_t step, const absl::Status& written);

  CheckpointManagerOptions options_;
  int64_t saved_step_ = -1;
  bool saved_ok_ = true;  // whether saved_step_'s checkpoint was written
  std::string last_path_;
  int64_t failures_ = 0;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_CHECKPOINT_CHECKPOINT_MANAGER_H_
