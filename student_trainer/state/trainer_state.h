// What a checkpoint records of the trainer besides weights and optimizer:
// the step, each teacher's stream cursor, the tokens trained, the
// subscriber id. trainer_state.json is read back on resume, so its reader
// checks every field (a damaged file is an error naming the file and the
// field, never a crash). No LibTorch here: the reader is fuzzed under the
// sanitizers (tests/fuzz/trainer_state_fuzz.cc).
#ifndef E3_STUDENT_TRAINER_STATE_TRAINER_STATE_H_
#define E3_STUDENT_TRAINER_STATE_TRAINER_STATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/stream/data_fingerprint.h"

namespace e3 {

// Where a stream resumes: the first batch not yet consumed or committed,
// and the data stream the position belongs to (empty: not known yet).
struct StreamCursor {
  // A position alone ({epoch, next_batch}) has no fingerprint yet.
  StreamCursor(int64_t e = 0, int64_t n = 0, DataFingerprint d = {}, int64_t c = -1)
      : epoch(e), next_batch(n), data(std::move(d)), consumed(c) {}
  int64_t epoch = 0;
  int64_t next_batch = 0;
  DataFingerprint data;
  // Batches taken from this stream since the run began; -1: not known (a
  // checkpoint written before it was counted).
  int64_t consumed = -1;
};

struct TrainerState {
  int64_t step = 0;
  // Per teacher (in --teacher order): the first batch not in the weights.
  std::vector<StreamCursor> cursors;
  int64_t tokens = 0;
  std::string subscriber_id;
  // Batches taken without a step (a rank's empty share of a small global
  // batch, with one rank): every batch taken is a step or one of these.
  int64_t skipped_batches = 0;
};

// Whether the cursors are where the steps taken put them: every batch
// taken was a step or a skipped batch, and a cursor still in epoch 0 is
// at the batch count taken from its stream (a later epoch's position is
// below it). A cursor edited by hand, or copied from another run, fails:
// DataLoss naming `source`, the cursor and the counts. Cursors of unknown
// count are not checked.
absl::Status CheckCursorsAgainstSteps(const TrainerState& state, const std::string& source);

std::string TrainerStateToJson(const TrainerState& state);
// `source` names the file in errors. DataLoss unless "step" is an integer
// >= 0 and "cursors" an array of {"epoch", "next_batch"} integers >= 0;
// "tokens" (integer >= 0), "subscriber_id" (string) and each cursor's
// "fingerprint" (common/stream/data_fingerprint.h; absent in older checkpoints)
// may be absent.
absl::StatusOr<TrainerState> ParseTrainerState(const std::string& text, const std::string& source);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_STATE_TRAINER_STATE_H_
