#include "student_trainer/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "student_trainer/draft_export.h"

namespace e3 {
namespace fs = std::filesystem;
namespace {

constexpr char kLatest[] = "latest";
constexpr char kOptimizer[] = "optimizer.pt";
constexpr char kState[] = "trainer_state.json";

absl::Status WriteText(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) return absl::DataLossError(absl::StrCat(tmp, ": write failed (disk full?)"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::DataLossError(absl::StrCat("rename ", tmp, " -> ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const TrainerState& state,
                                           const Eagle3DraftImpl& draft, torch::optim::Optimizer& optimizer,
                                           int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  const std::string name = absl::StrFormat("step-%08d", state.step);
  const fs::path final_path = fs::path(dir) / name;
  const fs::path tmp = fs::path(dir) / (name + ".tmp");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(tmp.string(), ": cannot create: ", ec.message()));
  DraftExportOptions exp;
  exp.dtype = at::kFloat;  // exact resume; the final export picks its own dtype
  E3_RETURN_IF_ERROR(ExportDraft(draft, tmp.string(), exp));
  try {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to((tmp / kOptimizer).string());
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(tmp.string(), ": saving the optimizer: ", e.what_without_backtrace()));
  }
  nlohmann::json j = {{"step", state.step},
                      {"cursor", {{"epoch", state.cursor.epoch}, {"next_batch", state.cursor.next_batch}}},
                      {"tokens", state.tokens},
                      {"subscriber_id", state.subscriber_id}};
  E3_RETURN_IF_ERROR(WriteText((tmp / kState).string(), j.dump(2)));
  fs::remove_all(final_path, ec);
  fs::rename(tmp, final_path, ec);
  if (ec) return absl::DataLossError(absl::StrCat("rename ", tmp.string(), ": ", ec.message()));
  E3_RETURN_IF_ERROR(WriteText((fs::path(dir) / kLatest).string(), name + "\n"));
  // Keep the newest `keep` checkpoints.
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep < steps.size(); ++i) fs::remove_all(fs::path(dir) / steps[i], ec);
  return final_path.string();
}

absl::StatusOr<std::optional<TrainerState>> LoadLatestCheckpoint(const std::string& dir, Eagle3DraftImpl& draft,
                                                                 torch::optim::Optimizer& optimizer) {
  const fs::path latest = fs::path(dir) / kLatest;
  if (!fs::exists(latest)) return std::optional<TrainerState>();
  std::string name;
  {
    std::ifstream f(latest);
    std::getline(f, name);
  }
  const fs::path path = fs::path(dir) / name;
  if (name.empty() || !fs::is_directory(path)) {
    return absl::DataLossError(absl::StrCat(latest.string(), " names \"", name, "\", which is not a checkpoint directory"));
  }
  E3_RETURN_IF_ERROR(LoadDraftExport(draft, path.string()));
  try {
    torch::serialize::InputArchive archive;
    archive.load_from((path / kOptimizer).string());
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat((path / kOptimizer).string(), ": ", e.what_without_backtrace()));
  }
  std::ifstream f(path / kState);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("step") || !j.contains("cursor")) {
    return absl::DataLossError(absl::StrCat((path / kState).string(), ": expected step and cursor"));
  }
  TrainerState st;
  st.step = j["step"].get<int64_t>();
  st.cursor.epoch = j["cursor"].value("epoch", int64_t{0});
  st.cursor.next_batch = j["cursor"].value("next_batch", int64_t{0});
  st.tokens = j.value("tokens", int64_t{0});
  st.subscriber_id = j.value("subscriber_id", std::string());
  return std::optional<TrainerState>(st);
}

}  // namespace e3
