// End to end on loopback with an EAGLE-3.1 draft: a real teacher_server
// serves the bundled tiny-code-llama, and a real student_trainer trains an
// EAGLE-3 draft with an RMSNorm per aux state before fc and the
// normalised output fed to the next step (draft.algorithm=eagle3.1) until
// the teacher's data ends. The loss falls, the real tau of chain rounds is
// measured on the teacher's eval set, and the export carries the keys and
// tensors vLLM and SGLang load for EAGLE-3.1, whose tau an independent
// measurement of the export reproduces.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/training_run.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

TEST(Eagle31TrainE2eTest, AnEagle31DraftTrainsAndExportsItsNorms) {
  const std::string dir = testing::ScratchDir("eagle31_train_e2e");
  std::vector<std::string> teacher_argv =
      testing::TrainingTeacherArgv(dir, kSrc + "/examples/tiny-code-llama", testing::TrainingSamples(60));
  for (const std::string& flag : std::vector<std::string>{"--draft_algorithm=eagle3.1",
                                  "--eval_prompts=" + kSrc + "/examples/data/eval_prompts.jsonl", "--eval_samples=8",
                                  "--eval_max_new_tokens=32"}) {
    teacher_argv.push_back(flag);
  }
  Subprocess teacher(teacher_argv, dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 120s)) << teacher.Log();
  std::vector<std::string> student_argv = testing::TrainingStudentArgv(dir, testing::ReadPortFile(dir + "/port"));
  for (const std::string& flag : {std::string("--draft_algorithm=eagle3.1"), std::string("--ttt_length=3"),
                                  "--eval_dump=" + dir + "/eval.safetensors", std::string("--export_dtype=float32")}) {
    student_argv.push_back(flag);
  }
  Subprocess student(student_argv, dir + "/student.log");
  ASSERT_NO_FATAL_FAILURE(testing::ExpectTrainingRunEnds(student, teacher, 300s));
  EXPECT_NE(student.Log().find("EAGLE-3.1 draft on cpu"), std::string::npos) << student.Log();

  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  const double first_loss = summary["first"]["loss"], last_loss = summary["last"]["loss"];
  std::printf("eagle3.1 e2e: %ld steps, loss %.3f -> %.3f, acc_0 %.3f -> %.3f\n",
              static_cast<long>(summary["steps"].get<int64_t>()), first_loss, last_loss,
              summary["first"]["acc"][0].get<double>(), summary["last"]["acc"][0].get<double>());
  if (!testing::kUnderThreadSanitizer) {
    EXPECT_GE(summary["steps"].get<int64_t>(), 20);
    EXPECT_LT(last_loss, first_loss);
  }
  ASSERT_TRUE(summary.contains("eval")) << summary.dump(2);
  const std::string chain = std::to_string(summary["eval"]["chains"][0].get<int64_t>());
  EXPECT_GT(summary["eval"]["rounds"][chain].get<int64_t>(), 0);
  EXPECT_GE(summary["eval"]["tau"][chain].get<double>(), 1.0);
  std::printf("eagle3.1 e2e: real tau %.3f trained, %.3f untrained\n", summary["eval"]["tau"][chain].get<double>(),
              summary["eval_untrained"]["tau"][chain].get<double>());

  auto cfg = nlohmann::json::parse(ReadFile(dir + "/export/config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"LlamaForCausalLMEagle3"}));
  EXPECT_EQ(cfg["fc_norm"], true);
  EXPECT_EQ(cfg["norm_output"], true);
  auto weights = SafetensorsFile::Open(dir + "/export/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (const char* name : {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}) {
    auto view = (*weights)->Get(name);
    ASSERT_TRUE(view.ok()) << name << ": " << view.status();
    EXPECT_EQ(view->shape, (std::vector<int64_t>{256})) << name;
  }
  testing::ExpectEverySampleCommittedOnce(teacher.Log());

  // The same tau, measured independently from the export and the dump by
  // tools/acceptance_crosscheck.py, which runs the EAGLE-3.1 draft as the
  // serving engines do (its fc_norm, and norm(out) fed to the next step).
  testing::ExpectCrosscheckAgrees(dir, summary["eval"]);
  // The draft's own lm_head proposes: the dump holds no target head.
  auto dump = SafetensorsFile::Open(dir + "/eval.safetensors");
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_FALSE((*dump)->Contains("target_lm_head"));
}

}  // namespace
}  // namespace e3
