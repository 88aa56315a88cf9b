#include "student_trainer/step/ttt_step.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "student_trainer/step/fast_step.h"
#include "student_trainer/step/reference_step.h"

namespace e3 {

absl::StatusOr<TttPositions> ParseTttPositions(std::string_view name) {
  if (name == "advancing") return TttPositions::kAdvancing;
  if (name == "fixed") return TttPositions::kFixed;
  return absl::InvalidArgumentError(
      absl::StrCat("--ttt_positions: expected \"advancing\" or \"fixed\", got \"", std::string(name), "\""));
}

absl::StatusOr<TttLoss> ParseTttLoss(std::string_view name) {
  if (name == "soft_ce") return TttLoss::kSoftCe;
  if (name == "lk_alpha") return TttLoss::kLkAlpha;
  if (name == "lk_lambda") return TttLoss::kLkLambda;
  return absl::InvalidArgumentError(absl::StrCat(
      "--ttt_loss: expected \"soft_ce\", \"lk_alpha\" or \"lk_lambda\", got \"", std::string(name), "\""));
}

absl::StatusOr<TttKernels> ParseTttKernels(std::string_view name) {
  if (name == "reference") return TttKernels::kReference;
  if (name == "fast") return TttKernels::kFast;
  return absl::InvalidArgumentError(
      absl::StrCat("--student_kernels: expected \"fast\" or \"reference\", got \"", std::string(name), "\""));
}

void ResolveTttMetrics(TttOutput* out) {
  if (!out->pending_metrics.defined()) return;
  // One device-to-host copy for all metrics.
  const at::Tensor m = out->pending_metrics.to(at::kCPU, at::kDouble).contiguous();
  out->pending_metrics = at::Tensor();
  const double* v = m.data_ptr<double>();
  const int64_t length = (m.numel() - 1) / kTttMetricsPerStep;
  out->ploss.clear();
  out->correct.clear();
  out->loss_tokens.clear();
  out->position_tokens.clear();
  out->acc.clear();
  out->acceptance_rate.clear();
  for (int64_t j = 0; j < length; ++j) {
    const double* row = v + kTttMetricsPerStep * j;
    out->ploss.push_back(row[0]);
    out->correct.push_back(static_cast<int64_t>(row[1]));
    out->loss_tokens.push_back(static_cast<int64_t>(row[2]));
    out->position_tokens.push_back(static_cast<int64_t>(row[3]));
    out->acc.push_back(row[1] / std::max(row[2], 1e-6));
    if (row[4] >= 0) out->acceptance_rate.push_back(row[4]);  // -1: not measured
  }
  out->loss_value = v[kTttMetricsPerStep * length];
  out->tau = SimulatedAcceptanceLength(out->acc);
}

double SimulatedAcceptanceLength(const std::vector<double>& acc) {
  double tau = 1.0;
  double prod = 1.0;
  for (double a : acc) {
    prod *= a;
    tau += prod;
  }
  return tau;
}

absl::StatusOr<TttOutput> RunTtt(Eagle3DraftImpl& draft, const TeacherBatch& batch,
                                 const TttOptions& options) {
  try {
    if (options.kernels == TttKernels::kFast) return RunTttFast(draft, batch, options);
    return RunTttReference(draft, batch, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("TTT forward: ", e.what_without_backtrace()));
  }
}

}  // namespace e3
