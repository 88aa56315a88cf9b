#include "student_trainer/algorithm/draft_algorithm.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/draft_aux_layers.h"
#include "student_trainer/algorithm/dflash_algorithm.h"
#include "student_trainer/algorithm/eagle3_algorithm.h"
#include "student_trainer/step/ttt_step.h"

namespace e3 {

std::string ComputeDtypeName(const DraftSettings& draft, const at::Device& device) {
  if (!draft.dtype.empty()) return draft.dtype;
  return device.is_cuda() ? "bfloat16" : "float32";
}

absl::StatusOr<std::unique_ptr<DraftOptimizer>> CreateScheduledOptimizer(const DraftSettings& draft,
                                                                         const ScheduleSettings& schedule,
                                                                         DraftModel& work, DraftModel* master,
                                                                         ProcessGroup* group) {
  E3_ASSIGN_OR_RETURN(const TttKernels kernels, ParseTttKernels(draft.kernels));
  DraftOptimizerOptions options;
  options.beta1 = schedule.adam_beta1;
  options.beta2 = schedule.adam_beta2;
  options.weight_decay = schedule.weight_decay;
  options.grad_clip = schedule.grad_clip;
  const DraftOptimizerKind kind =
      kernels == TttKernels::kFast ? DraftOptimizerKind::kFused : DraftOptimizerKind::kReference;
  return CreateDraftOptimizer(kind, work, master, group, options);
}

int64_t DraftedPositions(const DraftSettings& draft) {
  return draft.algorithm == "dflash" ? draft.dflash_block_size - 1 : draft.ttt_length;
}

absl::StatusOr<std::vector<int32_t>> DraftReadsLayers(const DraftSettings& draft, const ModelConfig& target) {
  return DraftAuxLayerIds(draft.algorithm, draft.aux_layer_ids, draft.init_from, draft.dflash_layers, target);
}

absl::StatusOr<std::unique_ptr<DraftAlgorithm>> CreateDraftAlgorithm(const DraftSettings& draft,
                                                                     const ScheduleSettings& schedule,
                                                                     const at::Device& device) {
  if (draft.algorithm == "dflash") {
    auto dflash = DFlashAlgorithm::Create(draft, schedule, device);
    if (!dflash.ok()) return dflash.status();
    return std::unique_ptr<DraftAlgorithm>(std::move(dflash).value());
  }
  if (draft.algorithm == "eagle3" || draft.algorithm == "eagle3.1") {
    auto eagle3 = Eagle3Algorithm::Create(draft, schedule, device);
    if (!eagle3.ok()) return eagle3.status();
    return std::unique_ptr<DraftAlgorithm>(std::move(eagle3).value());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--draft_algorithm (draft.algorithm) is \"", draft.algorithm, "\"; expected eagle3, eagle3.1 or dflash"));
}

}  // namespace e3
