// The draft with the best real acceptance length measured so far, kept
// beside the last one: every measurement (acceptance_eval.h) that beats
// the best exports the draft to its own folder, with the step and tau in
// its config.json ("e3_best"), so a run that overtrains or is stopped late
// still leaves its best draft to serve. Optionally the run stops once tau
// has not improved for `patience` measurements.
#ifndef E3_STUDENT_TRAINER_CHECKPOINT_BEST_DRAFT_H_
#define E3_STUDENT_TRAINER_CHECKPOINT_BEST_DRAFT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/draft_model.h"
#include "student_trainer/eval/acceptance.h"

namespace e3 {

struct BestDraftOptions {
  std::string dir;         // empty: the best is tracked, not exported
  int64_t chain = 7;       // tau at this chain length decides
  int64_t patience = 0;    // stop after this many measurements without a better tau; 0: never
  at::ScalarType dtype = at::kBFloat16;
  bool writer = true;      // rank 0 exports; the others only keep count
};

class BestDraft {
 public:
  // Takes the best so far from `dir`'s config.json when a resumed run
  // exported one (a worse draft never replaces it).
  static absl::StatusOr<BestDraft> Open(const BestDraftOptions& options);

  // After a measurement at `step`: exports `draft` when its tau beats the
  // best. Every rank gets the same report, so every rank decides alike.
  absl::Status Consider(int64_t step, const AcceptanceReport& report, const DraftModel& draft);
  // Whether `patience` measurements in a row brought nothing better.
  bool ShouldStop() const { return options_.patience > 0 && since_best_ >= options_.patience; }

  double tau() const { return tau_; }  // 0: nothing measured yet
  int64_t step() const { return step_; }
  int64_t measurements_since_best() const { return since_best_; }

 private:
  explicit BestDraft(BestDraftOptions options) : options_(std::move(options)) {}

  BestDraftOptions options_;
  double tau_ = 0;
  int64_t step_ = -1;
  int64_t since_best_ = 0;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_CHECKPOINT_BEST_DRAFT_H_
