// End to end on loopback with a DFlash draft: a real teacher_server serves
// the bundled tiny-code-llama capturing the layers a two-layer DFlash
// draft reads (draft.algorithm=dflash, no aux_layer_ids: spread over
// 1..L-3), and a real student_trainer trains blocks of four until the
// teacher's data ends. The loss falls, the real tau of block rounds is
// measured on the teacher's eval set, the export is the layout SGLang
// and vLLM load as a DFlash draft of that target, and an independent
// measurement of the export, drafting each round's block as SGLang's
// dflash_worker does, reproduces its tau.
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

TEST(DFlashTrainE2eTest, ADFlashDraftTrainsAndExportsForTheServingEngines) {
  const std::string dir = testing::ScratchDir("dflash_train_e2e");
  std::vector<std::string> teacher_argv =
      testing::TrainingTeacherArgv(dir, kSrc + "/examples/tiny-code-llama", testing::TrainingSamples(60));
  for (const std::string& flag : std::vector<std::string>{"--draft_algorithm=dflash", "--dflash_layers=2",
                                  "--eval_prompts=" + kSrc + "/examples/data/eval_prompts.jsonl", "--eval_samples=8",
                                  "--eval_max_new_tokens=32"}) {
    teacher_argv.push_back(flag);
  }
  Subprocess teacher(teacher_argv, dir + "/teacher.log");
  ASSERT_TRUE(testing::WaitForFile(dir + "/port", 120s)) << teacher.Log();
  std::vector<std::string> student_argv = testing::TrainingStudentArgv(dir, testing::ReadPortFile(dir + "/port"));
  for (const std::string& flag : {std::string("--draft_algorithm=dflash"), std::string("--dflash_layers=2"),
                                  std::string("--dflash_block_size=4"), std::string("--dflash_num_anchors=64"),
                                  "--eval_dump=" + dir + "/eval.safetensors", std::string("--export_dtype=float32")}) {
    student_argv.push_back(flag);
  }
  Subprocess student(student_argv, dir + "/student.log");
  ASSERT_NO_FATAL_FAILURE(testing::ExpectTrainingRunEnds(student, teacher, 300s));
  EXPECT_NE(student.Log().find("DFlash draft on cpu"), std::string::npos) << student.Log();

  auto summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  const double first_loss = summary["first"]["loss"], last_loss = summary["last"]["loss"];
  std::printf("dflash e2e: %ld steps, loss %.3f -> %.3f, acc_1 %.3f -> %.3f\n",
              static_cast<long>(summary["steps"].get<int64_t>()), first_loss, last_loss,
              summary["first"]["acc"][0].get<double>(), summary["last"]["acc"][0].get<double>());
  if (!testing::kUnderThreadSanitizer) {
    EXPECT_GE(summary["steps"].get<int64_t>(), 20);
    EXPECT_LT(last_loss, first_loss);
  }
  EXPECT_EQ(summary["first"]["acc"].size(), 3u) << "one accuracy per drafted row of a block of four";
  // The real tau of block rounds on the teacher's eval set: a round
  // proposes B - 1 = 3 tokens, and yields at least the target's own.
  ASSERT_TRUE(summary.contains("eval")) << summary.dump(2);
  EXPECT_EQ(summary["eval"]["chains"], nlohmann::json::parse("[3]"));
  EXPECT_GT(summary["eval"]["rounds"]["3"].get<int64_t>(), 0);
  EXPECT_GE(summary["eval"]["tau"]["3"].get<double>(), 1.0);
  EXPECT_LE(summary["eval"]["tau"]["3"].get<double>(), 4.0);
  std::printf("dflash e2e: real tau %.3f trained, %.3f untrained\n", summary["eval"]["tau"]["3"].get<double>(),
              summary["eval_untrained"]["tau"]["3"].get<double>());

  // The target's 8 layers: two spread over 1..L-3 are [1, 5].
  auto cfg = nlohmann::json::parse(ReadFile(dir + "/export/config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"DFlashDraftModel"}));
  EXPECT_EQ(cfg["block_size"].get<int64_t>(), 4);
  EXPECT_EQ(cfg["num_target_layers"].get<int64_t>(), 8);
  EXPECT_EQ(cfg["dflash_config"]["target_layer_ids"].get<std::vector<int32_t>>(), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(cfg["dflash_config"]["mask_token_id"].get<int64_t>(), cfg["vocab_size"].get<int64_t>() - 1);
  auto weights = SafetensorsFile::Open(dir + "/export/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ((*weights)->Get("fc.weight")->shape, (std::vector<int64_t>{256, 2 * 256}));
  EXPECT_FALSE((*weights)->Contains("lm_head.weight"));
  testing::ExpectEverySampleCommittedOnce(teacher.Log());

  // The dump carries the target's head the draft proposes through, which
  // the export does not hold.
  auto dump = SafetensorsFile::Open(dir + "/eval.safetensors");
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_TRUE((*dump)->Contains("target_lm_head"));
  EXPECT_EQ((*dump)->Get("target_lm_head")->shape, (std::vector<int64_t>{cfg["vocab_size"].get<int64_t>(), 256}));

  // The same tau, measured independently from the export and the dump by
  // tools/acceptance_crosscheck.py: per request, the context's keys and
  // values cached in every layer and extended with each round's committed
  // rows, the block [anchor, MASK x 3] drafted against them.
  testing::ExpectCrosscheckAgrees(dir, summary["eval"]);
}

}  // namespace
}  // namespace e3
