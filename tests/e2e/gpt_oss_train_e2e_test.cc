// End to end on loopback with a GPT-OSS teacher: a real teacher_server
// process serves a GptOssForCausalLM grafted onto the bundled
// tiny-code-llama (tests/e2e/grafted_gpt_oss_model.h: attention sinks, a
// sliding window of 16 on half the layers under samples of up to 256
// tokens, routed clamped-SwiGLU experts), and a real student_trainer trains
// a draft until the teacher's data ends. The loss falls, and the export
// carries the target's hidden size, vocabulary and aux layer ids.
#include <gtest/gtest.h>

#include <chrono>

#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/grafted_gpt_oss_model.h"
#include "tests/e2e/subprocess.h"
#include "tests/e2e/training_run.h"

namespace e3 {
namespace {

using namespace std::chrono_literals;
using testing::ReadFile;
using testing::Subprocess;

const std::string kSrc = E3_SOURCE_DIR;

TEST(GptOssTrainE2eTest, ADraftTrainsAgainstAGptOssTeacherAndExports) {
  const std::string dir = testing::ScratchDir("gpt_oss_train_e2e");
  const std::string model = testing::GraftedGptOssModel(kSrc + "/examples/tiny-code-llama", /*experts=*/4,
                                                        /*top_k=*/2, /*window=*/16, /*seed=*/11, dir);
  Subprocess teacher(testing::TrainingTeacherArgv(dir, model, /*max_samples=*/60), dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 120s)) << teacher.Log();
  Subprocess student(testing::TrainingStudentArgv(dir, testing::ReadPortFile(dir + "/port")), dir + "/student.log");
  ASSERT_NO_FATAL_FAILURE(testing::ExpectTrainingRunEnds(student, teacher, 300s));
  EXPECT_NE(teacher.Log().find("eager sink attention per sample (sliding window 16 on 4 of 8 layers)"),
            std::string::npos)
      << teacher.Log();

  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  const int64_t steps = summary["steps"].get<int64_t>();
  const double first_loss = summary["first"]["loss"], last_loss = summary["last"]["loss"];
  std::printf("gpt-oss e2e: %ld steps, loss %.3f -> %.3f, acc_0 %.3f -> %.3f\n", static_cast<long>(steps),
              first_loss, last_loss, summary["first"]["acc"][0].get<double>(),
              summary["last"]["acc"][0].get<double>());
  EXPECT_GE(steps, 20);
  EXPECT_LT(last_loss, first_loss);

  // The export is the target's: its hidden size, its vocabulary, and the
  // default aux ids [1, L/2 - 1, L - 4] of its 8 layers.
  auto cfg = nlohmann::json::parse(ReadFile(dir + "/export/config.json"));
  EXPECT_EQ(cfg["target_hidden_size"].get<int64_t>(), 256);
  EXPECT_EQ(cfg["vocab_size"].get<int64_t>(), 8192);
  EXPECT_EQ(cfg["draft_vocab_size"].get<int64_t>(), 512);
  EXPECT_EQ(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"].get<std::vector<int32_t>>(),
            (std::vector<int32_t>{1, 3, 4}));
  auto weights = SafetensorsFile::Open(dir + "/export/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->Get("fc.weight")->shape, (std::vector<int64_t>{256, 3 * 256}));
  testing::ExpectEverySampleCommittedOnce(teacher.Log());
}

}  // namespace
}  // namespace e3
