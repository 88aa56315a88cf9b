#include "student_trainer/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
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
  nlohmann::json cursors = nlohmann::json::array();
  for (const StreamCursor& c : state.cursors) cursors.push_back({{"epoch", c.epoch}, {"next_batch", c.next_batch}});
  nlohmann::json j = {{"step", state.step},
                      {"cursors", cursors},
                      {"tokens", state.tokens},
                      {"subscriber_id", state.subscriber_id}};
  E3_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(tmp, kState), j.dump(2)));
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
  if (name.empty() || !IsDirectory(path)) {
    return absl::DataLossError(absl::StrCat(latest, " names \"", name, "\", which is not a checkpoint directory"));
  }
  E3_RETURN_IF_ERROR(LoadDraftExport(draft, path));
  E3_RETURN_IF_ERROR(optimizer.Load(path));
  E3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(JoinPath(path, kState)));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer() || !j.contains("cursors") ||
      !j["cursors"].is_array()) {
    return absl::DataLossError(
        absl::StrCat(JoinPath(path, kState), ": expected an integer \"step\" and a \"cursors\" array"));
  }
  TrainerState st;
  st.step = j["step"].get<int64_t>();
  for (const auto& c : j["cursors"]) {
    if (!c.is_object()) return absl::DataLossError(absl::StrCat(JoinPath(path, kState), ": a cursor is not an object"));
    st.cursors.push_back({c.value("epoch", int64_t{0}), c.value("next_batch", int64_t{0})});
  }
  st.tokens = j.value("tokens", int64_t{0});
  st.subscriber_id = j.value("subscriber_id", std::string());
  return std::optional<TrainerState>(st);
}

}  // namespace e3
