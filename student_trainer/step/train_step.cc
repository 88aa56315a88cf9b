#include "student_trainer/step/train_step.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace e3 {

absl::StatusOr<TttOutput> TrainStep(Eagle3DraftImpl& draft, DraftOptimizer& optimizer,
                                    const TeacherBatch* batch, const TttOptions& ttt, double lr,
                                    int64_t step) {
  optimizer.BeginStep();
  TttOutput out;
  if (batch != nullptr) {
    E3_ASSIGN_OR_RETURN(out, RunTtt(draft, *batch, ttt));
  } else {
    out.loss =
        torch::zeros({}, torch::TensorOptions().device(draft.options().device).requires_grad(true));
  }
  try {
    out.loss.backward();
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("training step ", step, ": ", e.what_without_backtrace()));
  }
  E3_RETURN_IF_ERROR(optimizer.FinishStep(lr));
  try {
    // An asynchronous device error of the step surfaces here.
    ResolveTttMetrics(&out);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("training step ", step, ": ", e.what_without_backtrace()));
  }
  if (!std::isfinite(out.loss_value)) {
    return absl::InternalError(absl::StrCat("loss is ", out.loss_value, " at step ", step));
  }
  return out;
}

}  // namespace e3
