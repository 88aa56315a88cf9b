#include "student_trainer/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "student_trainer/draft_export.h"

namespace e3 {
namespace {

// std::filesystem is avoided here: see common/file_util.h.
constexpr char kLatest[] = "latest";
constexpr char kState[] = "trainer_state.json";

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const TrainerState& state,
                                           const Eagle3DraftImpl& draft, DraftOptimizer& optimizer,
                                           int keep) {
  E3_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string name = absl::StrFormat("step-%08d", state.step);
  const std::string final_path = JoinPath(dir, name);
  const std::string tmp = JoinPath(dir, name + ".tmp");
  E3_RETURN_IF_ERROR(RemoveAll(tmp));
  E3_RETURN_IF_ERROR(MakeDirs(tmp));
  DraftExportOptions exp;
  exp.dtype = at::kFloat;  // exact resume; the final export picks its own dtype
  E3_RETURN_IF_ERROR(ExportDraft(draft, tmp, exp));
  E3_RETURN_IF_ERROR(optimizer.Save(tmp));
  E3_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(tmp, kState), TrainerStateToJson(state)));
  E3_RETURN_IF_ERROR(RemoveAll(final_path));
  E3_RETURN_IF_ERROR(RenamePath(tmp, final_path));
  E3_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, kLatest), name + "\n"));
  // Keep the newest `keep` checkpoints.
  E3_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDir(dir));
  std::vector<std::string> steps;
  for (const auto& n : entries) {
    if (n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos && IsDirectory(JoinPath(dir, n))) {
      steps.push_back(n);
    }
  }
  for (size_t i = 0; i + keep < steps.size(); ++i) E3_RETURN_IF_ERROR(RemoveAll(JoinPath(dir, steps[i])));
  return final_path;
}

absl::StatusOr<std::optional<TrainerState>> LoadLatestCheckpoint(const std::string& dir, Eagle3DraftImpl& draft,
                                                                 DraftOptimizer& optimizer) {
  const std::string latest = JoinPath(dir, kLatest);
  if (!PathExists(latest)) return std::optional<TrainerState>();
  E3_ASSIGN_OR_RETURN(std::string name, ReadFileToString(latest));
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string path = JoinPath(dir, name);
  // `latest` names a directory beside it, never a path elsewhere.
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos || !IsDirectory(path)) {
    return absl::DataLossError(absl::StrCat(latest, " names \"", name, "\", which is not a checkpoint directory"));
  }
  E3_RETURN_IF_ERROR(LoadDraftExport(draft, path));
  E3_RETURN_IF_ERROR(optimizer.Load(path));
  E3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(JoinPath(path, kState)));
  E3_ASSIGN_OR_RETURN(TrainerState st, ParseTrainerState(text, JoinPath(path, kState)));
  return std::optional<TrainerState>(st);
}

}  // namespace e3
