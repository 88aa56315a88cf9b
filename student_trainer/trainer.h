// The student's training run, in the shape of torchtitan's Trainer: its
// components are built from the run config's sections, each deciding its
// own timing, and the loop reads as Train() -> TrainOneBatch() -> the
// algorithm's Step():
//   teacher_pool.h        connect, agree, round-robin, cursors
//   draft_algorithm.h     the draft algorithm: its model, optimizer, step
//   data_parallel.h       the c10d group, the initial broadcast
//   checkpoint_manager.h  resume, periodic saves, commits at the teachers
//   metrics_processor.h   windows, step log, Prometheus, the console line
//   acceptance_eval.h     the real acceptance length
//   best_draft.h          the best-tau export, early stopping
//   draft_export.h        the SGLang/vLLM export at the end
#ifndef E3_STUDENT_TRAINER_TRAINER_H_
#define E3_STUDENT_TRAINER_TRAINER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "student_trainer/eval/acceptance_eval.h"
#include "student_trainer/metrics/metrics_processor.h"
#include "student_trainer/student_process.h"

namespace e3 {

struct TrainSummary {
  int64_t steps = 0;       // since step 0, across resumes
  int64_t tokens = 0;      // since step 0, across resumes
  int64_t run_steps = 0;   // by this process
  int64_t run_tokens = 0;  // by this process
  double seconds = 0;        // wall time of the run, connecting and fetching weights included
  double train_seconds = 0;  // first step's start to the last step's end (the rates use this)
  double data_wait_seconds = 0;
  WindowStats first, last;  // averages over the first and last windows
  std::string export_dir;
  std::string last_checkpoint;
  int64_t checkpoint_failures = 0;  // not written (--on_checkpoint_save_error=continue)
  bool resumed = false;
  int64_t resumed_from_step = 0;
  std::string warm_started_from;  // the init_from export, when no checkpoint resumed the run
  bool stopped_by_signal = false;
  // Stopped because tau stopped improving (early_stop_patience).
  bool stopped_early = false;
  // The best real tau measured and where its draft went (best_dir).
  double best_tau = 0;
  int64_t best_step = -1;
  std::string best_dir;
  std::string device;     // where the draft trained
  std::string dtype;      // its compute dtype
  std::string transport;  // how the last batch arrived
  // The real acceptance length at the end, of the trained draft and of the
  // draft as initialised (when the teacher has an eval set).
  std::optional<AcceptanceReport> eval, eval_untrained;
  std::string ToJson() const;
};

// Connects, builds the draft, resumes, trains until max_steps, the end of
// the data or *process.stop, then checkpoints, measures and exports.
// `metrics` may be null.
absl::StatusOr<TrainSummary> RunTrainer(const RunConfig& config, const StudentProcess& process,
                                        StudentMetrics* metrics);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_TRAINER_H_
