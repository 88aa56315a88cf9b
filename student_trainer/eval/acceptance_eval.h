// When and on what the trainer measures the real acceptance length
// (acceptance.h): every `every` steps once the teacher's eval set is
// ready, and at the end of the run (waiting for the set, bounded), with
// the draft as initialised beside it for comparison. The set is fetched
// once and kept on the host. Under data parallelism rank 0 decides when
// the set is ready and tells the others, so that every rank measures at
// the same steps and their collectives meet.
#ifndef E3_STUDENT_TRAINER_EVAL_ACCEPTANCE_EVAL_H_
#define E3_STUDENT_TRAINER_EVAL_ACCEPTANCE_EVAL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "student_trainer/eval/acceptance.h"
#include "student_trainer/feed/teacher_client.h"

namespace e3 {

class ProcessGroup;

struct AcceptanceEvalOptions {
  int64_t every = 0;    // steps between measurements; 0: only at the end
  int64_t chain = 7;    // chain length K; 3 and 5 are reported too where below K
  double wait_s = 600;  // at the end, how long to wait for the teacher's set
  // Also measure the draft as initialised (the same seed rebuilds it) at
  // the end: what training bought.
  bool untrained = true;
  // Write the eval set and the final results here (rank 0), for
  // tools/acceptance_crosscheck.py.
  std::string dump;
};

class AcceptanceEval {
 public:
  // Asks teacher `client` whether it has an eval set; without one the
  // evaluator stays disabled and every call is a no-op.
  static absl::StatusOr<std::unique_ptr<AcceptanceEval>> Create(TeacherClient* client, AcceptanceEvalOptions options,
                                                                ProcessGroup* group, const ParallelLayout& layout,
                                                                const at::Device& device);

  bool enabled() const { return available_; }
  const std::vector<int64_t>& chain_lengths() const { return chains_; }

  // After step `step`: measures `draft` when a measurement is due and the
  // set is ready (nullopt otherwise; a set still generating is said once
  // per due step).
  absl::StatusOr<std::optional<AcceptanceReport>> AtStep(int64_t step, DraftModel& draft);
  // At the end (after step `step`): waits up to wait_s for the set, then
  // measures `draft`, unless AtStep just did at this step.
  absl::StatusOr<std::optional<AcceptanceReport>> Final(int64_t step, DraftModel& draft);
  // Holds the eval set, waiting up to wait_s for the teacher to finish it;
  // false when it was not ready in time (or there is none). The trainer
  // calls it before its last commit: a teacher that exits once every rank
  // has committed must not be needed afterwards.
  absl::StatusOr<bool> AwaitSet();
  // The step of the last AtStep measurement (-1: none).
  int64_t measured_at() const { return measured_at_; }
  // The same measurement of another draft (the untrained one), once the
  // set is here; nullopt before.
  absl::StatusOr<std::optional<AcceptanceReport>> Measure(DraftModel& draft);
  // Writes the set, the frozen embeddings (and the target's lm_head where
  // the draft proposes through it) and `report` to options.dump.
  absl::Status Dump(const DraftModel& draft, const AcceptanceReport& report) const;

 private:
  AcceptanceEval(TeacherClient* client, AcceptanceEvalOptions options, ProcessGroup* group, const ParallelLayout& layout,
                 const at::Device& device);
  // Fetches the set where rank 0 finds it ready; true once every rank has it.
  absl::StatusOr<bool> EnsureSet(bool log_waiting);

  TeacherClient* client_;
  AcceptanceEvalOptions options_;
  ProcessGroup* group_;
  const ParallelLayout layout_;
  at::Device device_;
  bool available_ = false;
  bool gave_up_waiting_ = false;  // AwaitSet waited its wait_s once: the end does not wait again
  std::vector<int64_t> chains_;
  std::vector<EvalBatch> batches_;
  bool have_set_ = false;
  int64_t measured_at_ = -1;
  std::optional<AcceptanceReport> last_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_EVAL_ACCEPTANCE_EVAL_H_
