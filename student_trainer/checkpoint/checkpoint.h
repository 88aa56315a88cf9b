// Student checkpoints: the draft (an fp32 export: config.json +
// model.safetensors), the optimizer state (optimizer.safetensors) and the
// trainer state with the stream cursors (trainer_state.json), in
// `<dir>/step-NNNNNNNN/`, and `<dir>/latest` naming the newest.
//
// Durable before it counts: every file is written under `step-N.tmp/`,
// fsynced, and the directory fsynced; only then is it renamed to `step-N`
// (and `<dir>` fsynced), and only then does `latest` move (written the same
// way). A crash or a full disk at any point leaves the previous checkpoints
// as they were, so a `step-N` directory is complete by construction.
//
// Every file's size and CRC-32C are recorded last, in checksums.json
// (state/checkpoint_checksums.h), and checked before anything is read.
//
// Resume takes the newest `step-N` that loads. One that does not (a file
// whose bytes changed, a truncated safetensors file, bad JSON, a missing
// file, a size that does not match the draft) is skipped with the reason,
// naming the file, and the next older one is tried; each loader checks everything before it copies
// anything, so a skipped checkpoint leaves the draft and optimizer as they
// were (LibTorch's legacy optimizer.pt archive excepted). What to do when
// none loads is the caller's decision (checkpoint_manager.h).
#ifndef E3_STUDENT_TRAINER_CHECKPOINT_CHECKPOINT_H_
#define E3_STUDENT_TRAINER_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/draft_model.h"
#include "student_trainer/optim/draft_optimizer.h"
#include "student_trainer/state/trainer_state.h"

namespace e3 {

// The newest and the one before it: the fallback when the newest is found
// damaged must survive the newest's save.
inline constexpr int kMinKeepCheckpoints = 2;

// Saves `<dir>/step-NNNNNNNN/` and points `<dir>/latest` at it, then keeps
// the newest `keep` (>= kMinKeepCheckpoints) checkpoints. Checkpoint
// directories of this step or later (ones a resume skipped as unloadable)
// are first renamed to `<name>.unloadable`, kept for inspection. A failed
// write removes its temporary directory, names the file and the bytes it
// could not write, and leaves `latest` and every checkpoint as they were.
// Returns the checkpoint's path.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const TrainerState& state,
                                           const DraftModel& draft, DraftOptimizer& optimizer,
                                           int keep = kMinKeepCheckpoints);

struct LoadedCheckpoint {
  std::optional<TrainerState> state;  // the newest checkpoint that loaded; empty: none did
  std::string path;                   // its directory
  // Newest first: every checkpoint newer than the one loaded (all of them
  // when none loaded) and why it did not load, and a `latest` that names
  // no checkpoint. Empty with no state: `dir` holds no checkpoint at all.
  std::vector<std::string> problems;
};

// Loads the newest loadable checkpoint in `dir` into `draft` and
// `optimizer`. Errors only when `dir` cannot be read.
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir, DraftModel& draft,
                                                      DraftOptimizer& optimizer);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_CHECKPOINT_CHECKPOINT_H_
