// When and how the trainer checkpoints (checkpoint.h holds the format):
// every `every` steps and at the end, never twice at one step. Rank 0
// writes (ranks step in lockstep, so its weights, optimizer and cursors
// are every rank's); every rank then waits for the others and only then
// reports the checkpoint's cursors to the teachers as committed (DESIGN.md
// "exactly once into the weights that survive").
#ifndef E3_STUDENT_TRAINER_CHECKPOINT_MANAGER_H_
#define E3_STUDENT_TRAINER_CHECKPOINT_MANAGER_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/torch/process_group.h"
#include "student_trainer/checkpoint.h"
#include "student_trainer/teacher_pool.h"

namespace e3 {

struct CheckpointManagerOptions {
  std::string dir;  // empty: no checkpoints and no resume
  int64_t every = 100;
  int rank = 0;
  ProcessGroup* group = nullptr;  // data parallelism; null for one rank
  at::Device device = at::kCPU;   // where the barrier's tensor lives
};

class CheckpointManager {
 public:
  explicit CheckpointManager(CheckpointManagerOptions options) : options_(std::move(options)) {}

  // Loads the latest checkpoint into `trained` and `optimizer`, if there is
  // one; it must hold a cursor for each of `teachers`.
  absl::StatusOr<std::optional<TrainerState>> Resume(Eagle3DraftImpl& trained,
                                                     DraftOptimizer& optimizer, size_t teachers);
  // Whether step `step` (just finished) is a periodic checkpoint.
  bool Due(int64_t step) const { return options_.every > 0 && step % options_.every == 0; }
  // Writes `state` (unless this step is already saved), waits for every
  // rank, then commits the cursors at the teachers; the `last` save waits
  // until every teacher has the commit (one away may come back). A
  // `final_report` (the student stops on a signal) sends its cursors even
  // when a teacher has them already: a draining teacher waits for it.
  absl::Status Save(const TrainerState& state, const Eagle3DraftImpl& trained,
                    DraftOptimizer& optimizer, TeacherPool& teachers, bool last = false,
                    bool final_report = false);
  // The path of the last checkpoint this rank wrote (empty: none).
  const std::string& last_path() const { return last_path_; }

 private:
  CheckpointManagerOptions options_;
  int64_t saved_step_ = -1;
  std::string last_path_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_CHECKPOINT_MANAGER_H_
