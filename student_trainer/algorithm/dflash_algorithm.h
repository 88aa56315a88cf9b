// DFlash (https://arxiv.org/abs/2602.06036) behind the draft-algorithm
// seam: the block draft of dflash_draft.h over the target layers it asks
// its teacher for (without draft.aux_layer_ids, dflash_layers of them,
// spread as the recipes spread them), the target's
// embedding and full head from the teacher, fp32 master weights below
// fp32. A step draws the batch's anchors (dflash_blocks.h), runs every
// block in one pass and takes the optimizer step on the weighted block
// loss, whose head runs in row chunks (ops/dflash_head_loss.h). The
// layers' attention is the reference formulation (a dense mask) on every
// device.
#ifndef E3_STUDENT_TRAINER_ALGORITHM_DFLASH_ALGORITHM_H_
#define E3_STUDENT_TRAINER_ALGORITHM_DFLASH_ALGORITHM_H_

#include <memory>
#include <optional>
#include <string>

#include "student_trainer/algorithm/draft_algorithm.h"
#include "student_trainer/draft/dflash_draft.h"
#include "student_trainer/ops/dflash_head_loss.h"
#include "student_trainer/step/dflash_blocks.h"

namespace e3 {

class DFlashAlgorithm : public DraftAlgorithm {
 public:
  // Checks the settings it reads; errors name the flag.
  static absl::StatusOr<std::unique_ptr<DFlashAlgorithm>> Create(const DraftSettings& draft,
                                                                 const ScheduleSettings& schedule,
                                                                 const at::Device& device);

  const char* name() const override { return "dflash"; }
  // The full head: the draft vocab's rows and the rest.
  absl::StatusOr<TeacherNeeds> needs(const ModelConfig& target) const override;
  absl::Status Build(const TeacherInfo& info, const FrozenWeights& frozen, ProcessGroup* group) override;
  std::string Describe() const override;
  const std::string& compute_dtype() const override { return dtype_name_; }
  int64_t drafted_positions() const override { return settings_.dflash_block_size - 1; }
  int64_t eval_chain() const override { return settings_.dflash_block_size - 1; }
  DraftModel& trained() override { return master_.has_value() ? **master_ : *draft_; }
  DraftOptimizer& optimizer() override { return *optimizer_; }
  absl::StatusOr<DraftStepOutput> Step(const TeacherBatch* batch, double lr, int64_t step) override;
  absl::Status WarmStart(const std::string& export_dir) override;
  absl::StatusOr<std::shared_ptr<DraftModel>> Initial() const override;

 private:
  DFlashAlgorithm(const DraftSettings& draft, const ScheduleSettings& schedule, const at::Device& device)
      : settings_(draft), schedule_(schedule), device_(device) {}
  // The loss over the batch's blocks, and its metrics per drafted row.
  absl::StatusOr<at::Tensor> BlockLoss(const TeacherBatch& batch, int64_t step, DraftStepOutput* out);

  const DraftSettings settings_;
  const ScheduleSettings schedule_;
  const at::Device device_;
  std::string dtype_name_;
  at::ScalarType dtype_ = at::kFloat;
  DFlashDraftConfig config_;
  DFlashBlockOptions blocks_;
  DFlashKernels kernels_ = DFlashKernels::kFast;
  ops::DFlashHeadLossOptions loss_;  // the head and block loss, in row chunks
  DFlashFrozenTensors frozen_;  // on the device, in the compute dtype
  DFlashDraft draft_{nullptr};
  std::optional<DFlashDraft> master_;
  std::unique_ptr<DraftOptimizer> optimizer_;
  std::string warm_start_;
};

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_ALGORITHM_DFLASH_ALGORITHM_H_
