#include "common/config/config_file.h"
#include "launcher/plan_inputs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

const std::string kSourceDir = E3_SOURCE_DIR;

NodePlan Plan(const std::vector<std::string>& overrides, const std::string& build_dir) {
  std::vector<std::string> all = {"teachers.devices=cpu", "students.devices=cpu",
                                  "run.out=/tmp/run"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  auto c = ParseRunConfig("", "run.yaml", all);
  EXPECT_TRUE(c.ok()) << c.status();
  auto plan = PlanNode(c.value_or(RunConfig()), build_dir, "ab12");
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.value_or(NodePlan());
}

// A build tree with both binaries (empty executables).
std::string FakeBuildDir() {
  const std::string dir = testing::ScratchDir("plan_inputs_build");
  for (const char* binary : {"teacher_server/teacher_server", "student_trainer/student_trainer"}) {
    const std::string path = JoinPath(dir, binary);
    EXPECT_TRUE(MakeDirs(Dirname(path)).ok());
    std::ofstream(path) << "";
    EXPECT_EQ(::chmod(path.c_str(), 0755), 0);
  }
  return dir;
}

TEST(PlanInputsTest, EveryMissingInputIsNamedWithItsKey) {
  const NodePlan plan =
      Plan({"model.dir=/nonexistent/model", "data.train=/nonexistent/train.jsonl",
            "data.eval_prompts=/nonexistent/eval.jsonl", "template.file=/nonexistent/chat.jinja",
            "draft.vocab_map=/nonexistent/vocab.safetensors"},
           "/nonexistent/build");
  EXPECT_EQ(absl::StrJoin(MissingInputs(plan), "\n"),
            "run.yaml: model.dir: /nonexistent/model: not a directory\n"
            "run.yaml: data.train: /nonexistent/train.jsonl: no such file\n"
            "run.yaml: data.eval_prompts: /nonexistent/eval.jsonl: no such file\n"
            "run.yaml: template.file: /nonexistent/chat.jinja: no such file\n"
            "run.yaml: draft.vocab_map: /nonexistent/vocab.safetensors: no such file\n"
            "e3_launch --build_dir: /nonexistent/build/student_trainer/student_trainer: not an "
            "executable (build it first?)\n"
            "e3_launch --build_dir: /nonexistent/build/teacher_server/teacher_server: not an "
            "executable (build it first?)");
}

TEST(PlanInputsTest, AModelDirectoryNeedsAConfigThatParses) {
  const std::string model = testing::ScratchDir("plan_inputs_model");
  const std::string data = kSourceDir + "/examples/data/train_conversations.jsonl";
  const std::string build = FakeBuildDir();
  EXPECT_EQ(
      absl::StrJoin(MissingInputs(Plan({"model.dir=" + model, "data.train=" + data}, build)), "\n"),
      "run.yaml: model.dir: " + model + ": no config.json");
  std::ofstream(JoinPath(model, "config.json")) << "{\"hidden_size\": ";
  const std::vector<std::string> problems =
      MissingInputs(Plan({"model.dir=" + model, "data.train=" + data}, build));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("run.yaml: model.dir: " + model + "/config.json", 0), 0u)
      << problems[0];
  // A data path that is a directory is no file either.
  EXPECT_EQ(
      absl::StrJoin(MissingInputs(Plan({"model.dir=" + kSourceDir + "/examples/tiny-code-llama",
                                        "data.train=" + model},
                                       build)),
                    "\n"),
      "run.yaml: data.train: " + model + ": not a regular file");
}

TEST(PlanInputsTest, ARunOfTheBundledModelHasEverything) {
  const NodePlan plan =
      Plan({"model.dir=" + kSourceDir + "/examples/tiny-code-llama",
            "data.train=" + kSourceDir + "/examples/data/train_conversations.jsonl",
            "data.eval_prompts=" + kSourceDir + "/examples/data/eval_prompts.jsonl"},
           FakeBuildDir());
  EXPECT_TRUE(MissingInputs(plan).empty()) << absl::StrJoin(MissingInputs(plan), "\n");
}

}  // namespace
}  // namespace e3
