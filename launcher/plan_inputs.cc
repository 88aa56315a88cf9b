#include "launcher/plan_inputs.h"

#include <unistd.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"

namespace e3 {
namespace {

// "" when `path` is a regular file; else why not.
std::string FileProblem(const std::string& path) {
  if (IsRegularFile(path)) return "";
  return PathExists(path) ? "not a regular file" : "no such file";
}

std::string ModelProblem(const NodePlan& plan) {
  const std::string& dir = plan.config.model.dir;
  if (!IsDirectory(dir)) return absl::StrCat(dir, ": not a directory");
  if (!IsRegularFile(JoinPath(dir, "config.json"))) return absl::StrCat(dir, ": no config.json");
  // A config.json that does not parse is an error too: the teacher reads
  // it with the same parser (common/model/model_config.h) and would stop on it
  // after starting, so planning says it first.
  if (!plan.model.has_value()) return plan.model_error;
  return "";
}

}  // namespace

std::vector<std::string> MissingInputs(const NodePlan& plan) {
  const RunConfig& c = plan.config;
  std::vector<std::string> problems;
  const std::string model = ModelProblem(plan);
  if (!model.empty()) problems.push_back(absl::StrCat(c.source, ": model.dir: ", model));
  // Optional files only when given.
  const std::pair<const char*, const std::string*> files[] = {
      {"data.train", &c.data.train},
      {"data.eval_prompts", &c.data.eval_prompts},
      {"template.file", &c.chat_template.file},
      {"draft.vocab_map", &c.draft.vocab_map},
  };
  for (const auto& [key, path] : files) {
    if (path->empty()) continue;
    const std::string problem = FileProblem(*path);
    if (!problem.empty())
      problems.push_back(absl::StrCat(c.source, ": ", key, ": ", *path, ": ", problem));
  }
  if (!c.draft.init_from.empty()) {
    for (const char* file : {"config.json", "model.safetensors"}) {
      const std::string problem = FileProblem(JoinPath(c.draft.init_from, file));
      if (!problem.empty()) {
        problems.push_back(absl::StrCat(c.source, ": draft.init_from: ", c.draft.init_from, ": ", file, ": ",
                                        problem, " (expected a draft export)"));
      }
    }
  }
  std::set<std::string> binaries;
  for (const PlannedProcess& p : plan.processes) binaries.insert(p.binary);
  for (const std::string& binary : binaries) {
    if (::access(binary.c_str(), X_OK) != 0) {
      problems.push_back(
          absl::StrCat("e3_launch --build_dir: ", binary, ": not an executable (build it first?)"));
    }
  }
  return problems;
}

}  // namespace e3
