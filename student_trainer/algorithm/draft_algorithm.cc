#include "student_trainer/algorithm/draft_algorithm.h"

#include "absl/strings/str_cat.h"
#include "student_trainer/algorithm/dflash_algorithm.h"
#include "student_trainer/algorithm/eagle3_algorithm.h"

namespace e3 {

int64_t DraftedPositions(const DraftSettings& draft) {
  return draft.algorithm == "dflash" ? draft.dflash_block_size - 1 : draft.ttt_length;
}

absl::StatusOr<std::unique_ptr<DraftAlgorithm>> CreateDraftAlgorithm(const DraftSettings& draft,
                                                                     const ScheduleSettings& schedule,
                                                                     const at::Device& device) {
  if (draft.algorithm == "dflash") {
    auto dflash = DFlashAlgorithm::Create(draft, schedule, device);
    if (!dflash.ok()) return dflash.status();
    return std::unique_ptr<DraftAlgorithm>(std::move(dflash).value());
  }
  if (draft.algorithm == "eagle3") {
    auto eagle3 = Eagle3Algorithm::Create(draft, schedule, device);
    if (!eagle3.ok()) return eagle3.status();
    return std::unique_ptr<DraftAlgorithm>(std::move(eagle3).value());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--draft_algorithm (draft.algorithm) is \"", draft.algorithm, "\"; expected eagle3 or dflash"));
}

}  // namespace e3
