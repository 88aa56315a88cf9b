#include "student_trainer/checkpoint/checkpoint.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"
#include "student_trainer/draft/draft_export.h"
#include "student_trainer/optim/adamw_state_file.h"
#include "student_trainer/state/checkpoint_checksums.h"

namespace e3 {
namespace {

// std::filesystem is avoided here: see common/base/file_util.h.
constexpr char kLatest[] = "latest";
constexpr char kState[] = "trainer_state.json";
constexpr char kStepPrefix[] = "step-";
constexpr char kTmpSuffix[] = ".tmp";
constexpr char kUnloadableSuffix[] = ".unloadable";

std::string StepName(int64_t step) { return absl::StrFormat("%s%08d", kStepPrefix, step); }

// The step a checkpoint directory's name holds ("step-" and digits only),
// or -1: temporaries and set-aside directories are not checkpoints.
int64_t StepOfName(const std::string& name) {
  const size_t prefix = sizeof(kStepPrefix) - 1;
  if (name.size() <= prefix || name.compare(0, prefix, kStepPrefix) != 0) return -1;
  int64_t step = -1;
  const std::string digits = name.substr(prefix);
  if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) || !absl::SimpleAtoi(digits, &step)) {
    return -1;
  }
  return step;
}

// The checkpoint directories in `dir`, newest first; none when `dir` does
// not exist.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> CheckpointsNewestFirst(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (!IsDirectory(dir)) return out;
  E3_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDir(dir));
  for (const std::string& name : entries) {
    const int64_t step = StepOfName(name);
    if (step >= 0 && IsDirectory(JoinPath(dir, name))) out.emplace_back(step, name);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// The files of a checkpoint, each written and fsynced under `tmp`.
absl::Status WriteCheckpointFiles(const std::string& tmp, const TrainerState& state,
                                  const DraftModel& draft, DraftOptimizer& optimizer) {
  E3_RETURN_IF_ERROR(MakeDirs(tmp));
  DraftExportOptions exp;
  exp.dtype = at::kFloat;  // exact resume; the final export picks its own dtype
  E3_RETURN_IF_ERROR(draft.Export(tmp, exp));
  E3_RETURN_IF_ERROR(optimizer.Save(tmp));
  E3_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(tmp, kState), TrainerStateToJson(state)));
  return WriteChecksums(tmp);  // last: it covers every file above
}

// Checkpoints of `step` or later were not loaded by the resume that led
// here (or they would be the step), so they are set aside before this one
// takes their place: renamed, not deleted, so the damage can be inspected.
absl::Status SetAsideFrom(const std::string& dir, int64_t step) {
  E3_ASSIGN_OR_RETURN(auto checkpoints, CheckpointsNewestFirst(dir));
  for (const auto& [s, name] : checkpoints) {
    if (s < step) break;
    const std::string aside = JoinPath(dir, name + kUnloadableSuffix);
    E3_RETURN_IF_ERROR(RemoveAll(aside));
    E3_RETURN_IF_ERROR(RenamePath(JoinPath(dir, name), aside));
  }
  return absl::OkStatus();
}

// Keeps the newest `keep` checkpoints; also removes temporaries that a
// crashed save left (only rank 0 writes, and it is here, so none is live).
absl::Status Prune(const std::string& dir, int keep) {
  E3_ASSIGN_OR_RETURN(auto checkpoints, CheckpointsNewestFirst(dir));
  for (size_t i = static_cast<size_t>(keep); i < checkpoints.size(); ++i) {
    E3_RETURN_IF_ERROR(RemoveAll(JoinPath(dir, checkpoints[i].second)));
  }
  E3_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDir(dir));
  for (const std::string& name : entries) {
    absl::string_view base = name;
    if (absl::ConsumeSuffix(&base, kTmpSuffix) && StepOfName(std::string(base)) >= 0) {
      E3_RETURN_IF_ERROR(RemoveAll(JoinPath(dir, name)));
    }
  }
  return absl::OkStatus();
}

// One checkpoint into `draft` and `optimizer`. Everything that can be
// checked is checked before the first copy (the trainer state, the
// optimizer file, then the draft's own LoadExport checks), so a failure leaves
// both as they were.
absl::StatusOr<TrainerState> LoadCheckpointAt(const std::string& path, int64_t step, DraftModel& draft,
                                              DraftOptimizer& optimizer) {
  E3_RETURN_IF_ERROR(VerifyChecksums(path));
  const std::string state_path = JoinPath(path, kState);
  E3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(state_path));
  E3_ASSIGN_OR_RETURN(TrainerState state, ParseTrainerState(text, state_path));
  E3_RETURN_IF_ERROR(CheckCursorsAgainstSteps(state, state_path));
  if (state.step != step) {
    return absl::DataLossError(absl::StrCat(state_path, ": field \"step\" is ", state.step,
                                            ", but the directory is named for step ", step));
  }
  const std::string moments = JoinPath(path, kAdamWStateFile);
  if (IsRegularFile(moments)) {
    E3_RETURN_IF_ERROR(CheckAdamWState(moments, draft.ExportedParameters()));
  } else if (!IsRegularFile(JoinPath(path, kLegacyOptimizerFile))) {
    return absl::NotFoundError(absl::StrCat(moments, ": missing (the optimizer state)"));
  }
  E3_RETURN_IF_ERROR(draft.LoadExport(path, OtherTarget::kRefuse));
  E3_RETURN_IF_ERROR(optimizer.Load(path));
  return state;
}

// A problem with `latest` itself: it is only a pointer for people and
// tools (resume takes the newest step directory that loads), but one that
// names nothing means something went wrong.
std::optional<std::string> LatestProblem(const std::string& dir) {
  const std::string latest = JoinPath(dir, kLatest);
  if (!PathExists(latest)) return std::nullopt;
  absl::StatusOr<std::string> name = ReadFileToString(latest);
  if (!name.ok()) return std::string(name.status().message());
  const std::string target(absl::StripAsciiWhitespace(*name));
  if (StepOfName(target) < 0 || !IsDirectory(JoinPath(dir, target))) {
    return absl::StrCat(latest, " names \"", target, "\", which is not a checkpoint directory in ", dir);
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const TrainerState& state,
                                           const DraftModel& draft, DraftOptimizer& optimizer,
                                           int keep) {
  if (keep < kMinKeepCheckpoints) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoints to keep: expected at least ", kMinKeepCheckpoints,
                                                   " (the newest and its fallback), got ", keep));
  }
  E3_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string name = StepName(state.step);
  const std::string final_path = JoinPath(dir, name);
  const std::string tmp = final_path + kTmpSuffix;
  E3_RETURN_IF_ERROR(RemoveAll(tmp));
  const absl::Status written = WriteCheckpointFiles(tmp, state, draft, optimizer);
  if (!written.ok()) {
    (void)RemoveAll(tmp);  // give back the space the partial files took
    return absl::Status(written.code(), absl::StrCat("checkpoint ", final_path, " not written: ", written.message()));
  }
  E3_RETURN_IF_ERROR(SetAsideFrom(dir, state.step));
  E3_RETURN_IF_ERROR(RenamePath(tmp, final_path));
  E3_RETURN_IF_ERROR(SyncDirectory(dir));
  E3_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, kLatest), name + "\n"));
  E3_RETURN_IF_ERROR(Prune(dir, keep));
  return final_path;
}

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir, DraftModel& draft,
                                                      DraftOptimizer& optimizer) {
  LoadedCheckpoint out;
  if (std::optional<std::string> latest = LatestProblem(dir)) out.problems.push_back(*latest);
  E3_ASSIGN_OR_RETURN(auto checkpoints, CheckpointsNewestFirst(dir));
  for (const auto& [step, name] : checkpoints) {
    const std::string path = JoinPath(dir, name);
    absl::StatusOr<TrainerState> state = LoadCheckpointAt(path, step, draft, optimizer);
    if (!state.ok()) {
      out.problems.push_back(absl::StrCat(path, " does not load: ", state.status().message()));
      continue;
    }
    out.state = *std::move(state);
    out.path = path;
    break;
  }
  return out;
}

}  // namespace e3
