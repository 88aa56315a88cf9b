#include "student_trainer/checkpoint/best_draft.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace e3 {
namespace {

constexpr char kBestKey[] = "e3_best";

}  // namespace

absl::StatusOr<BestDraft> BestDraft::Open(const BestDraftOptions& options) {
  BestDraft best(options);
  const std::string config = JoinPath(options.dir, kDraftConfigFile);
  if (options.dir.empty() || !IsRegularFile(config)) return best;
  E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(config));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains(kBestKey)) return best;
  const nlohmann::json& b = j[kBestKey];
  if (!b.is_object() || !b.contains("tau") || !b["tau"].is_number() || !b.contains("step") ||
      !b["step"].is_number_integer() || !b.contains("eval_chain") || !b["eval_chain"].is_number_integer()) {
    return absl::DataLossError(
        absl::StrCat(config, ": field \"", kBestKey, "\": expected {\"step\", \"tau\", \"eval_chain\"}"));
  }
  // A best measured at another chain length is no yardstick for this one.
  if (b["eval_chain"].get<int64_t>() != options.chain) return best;
  best.tau_ = b["tau"].get<double>();
  best.step_ = b["step"].get<int64_t>();
  return best;
}

absl::Status BestDraft::Consider(int64_t step, const AcceptanceReport& report, const DraftModel& draft) {
  const double tau = report.TauAt(options_.chain);
  if (tau <= tau_) {
    ++since_best_;
    return absl::OkStatus();
  }
  tau_ = tau;
  step_ = step;
  since_best_ = 0;
  if (options_.dir.empty() || !options_.writer) return absl::OkStatus();
  DraftExportOptions o;
  o.dtype = options_.dtype;
  o.extra[kBestKey] = {{"step", step}, {"tau", tau}, {"eval_chain", options_.chain}};
  E3_RETURN_IF_ERROR(draft.Export(options_.dir, o));
  std::printf("student[0]: best draft so far (tau %.3f at chain %ld, step %ld) in %s\n", tau,
              static_cast<long>(options_.chain), static_cast<long>(step), options_.dir.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace e3
