// EAGLE-3 (https://arxiv.org/abs/2503.01840) and EAGLE-3.1 (the same draft
// with fc_norm and norm_output, eagle3_draft.h) behind the draft-algorithm
// seam: the draft of eagle3_draft.h, built from the teacher's model config
// and frozen tensors in its compute dtype, with fp32 master weights below
// fp32 (master_weights.h) and the optimizer over them; a step is the
// training-time test (ttt_step.h, reference or fast) unrolled over the
// batch, then the optimizer step.
#ifndef E3_STUDENT_TRAINER_ALGORITHM_EAGLE3_ALGORITHM_H_
#define E3_STUDENT_TRAINER_ALGORITHM_EAGLE3_ALGORITHM_H_

#include <memory>
#include <optional>
#include <string>

#include "student_trainer/algorithm/draft_algorithm.h"
#include "student_trainer/draft/eagle3_draft.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

class Eagle3Algorithm : public DraftAlgorithm {
 public:
  // Checks the draft and schedule settings it reads; errors name the flag.
  static absl::StatusOr<std::unique_ptr<Eagle3Algorithm>> Create(const DraftSettings& draft,
                                                                 const ScheduleSettings& schedule,
                                                                 const at::Device& device);

  const char* name() const override { return settings_.algorithm == "eagle3.1" ? "eagle3.1" : "eagle3"; }
  absl::StatusOr<TeacherNeeds> needs(const ModelConfig& target) const override;
  absl::Status Build(const TeacherInfo& info, const FrozenWeights& frozen, ProcessGroup* group) override;
  std::string Describe() const override;
  const std::string& compute_dtype() const override { return dtype_name_; }
  int64_t drafted_positions() const override { return ttt_.length; }
  int64_t eval_chain() const override { return schedule_.eval_chain; }
  DraftModel& trained() override { return master_.has_value() ? **master_ : *draft_; }
  DraftOptimizer& optimizer() override { return *optimizer_; }
  absl::StatusOr<DraftStepOutput> Step(const TeacherBatch* batch, double lr, int64_t step) override;
  absl::Status WarmStart(const std::string& export_dir) override;
  absl::StatusOr<std::shared_ptr<DraftModel>> Initial() const override;

  // The draft the TTT step runs (the bench and tests drive it directly).
  Eagle3DraftImpl& working() { return *draft_; }
  const TttOptions& ttt() const { return ttt_; }

 private:
  Eagle3Algorithm(const DraftSettings& draft, const ScheduleSettings& schedule, const at::Device& device)
      : settings_(draft), schedule_(schedule), device_(device) {}
  // The draft's config and options for the teacher's model.
  absl::Status MakeOptions(const TeacherInfo& info);
  // The frozen tensors on the device, in the dtypes the draft keeps them.
  absl::Status MoveFrozen(const FrozenWeights& frozen);

  const DraftSettings settings_;
  const ScheduleSettings schedule_;
  const at::Device device_;
  TttOptions ttt_;
  Eagle3DraftOptions options_;    // rebuild the draft as initialised from these
  Eagle3FrozenTensors frozen_;    // on the device, shared by draft and master
  Eagle3Draft draft_{nullptr};    // what the TTT step runs
  std::optional<Eagle3Draft> master_;  // its fp32 copy, below fp32
  std::unique_ptr<DraftOptimizer> optimizer_;
  std::string dtype_name_;
  std::string warm_start_;  // the export a warm start loaded (empty: none)
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_ALGORITHM_EAGLE3_ALGORITHM_H_
