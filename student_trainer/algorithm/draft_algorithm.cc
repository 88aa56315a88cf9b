#include "student_trainer/algorithm/draft_algorithm.h"

#include "absl/strings/str_cat.h"
#include "student_trainer/algorithm/eagle3_algorithm.h"

namespace e3 {

absl::StatusOr<std::unique_ptr<DraftAlgorithm>> CreateDraftAlgorithm(const DraftSettings& draft,
                                                                     const ScheduleSettings& schedule,
                                                                     const at::Device& device) {
  if (draft.algorithm == "eagle3") {
    auto eagle3 = Eagle3Algorithm::Create(draft, schedule, device);
    if (!eagle3.ok()) return eagle3.status();
    return std::unique_ptr<DraftAlgorithm>(std::move(eagle3).value());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--draft_algorithm (draft.algorithm) is \"", draft.algorithm, "\"; expected eagle3"));
}

}  // namespace e3
