// What each draft algorithm asks of its teacher: its layers (the setting,
// else the algorithm's default for the target's depth) in the order it
// reads them, and the tensors its loss reads: EAGLE-3 everything, DFlash
// the argmax unless it learns the data's tokens, and last_hidden only to
// distil the target's distribution (which the full head makes).
#include <gtest/gtest.h>

#include <string>

#include "common/base/file_util.h"
#include "common/model/model_config.h"
#include "student_trainer/algorithm/draft_algorithm.h"

namespace e3 {
namespace {

ModelConfig TinyTarget() {
  const std::string path = std::string(E3_SOURCE_DIR) + "/examples/tiny-code-llama/config.json";
  return ParseModelConfig(ReadFileToString(path).value(), path).value();
}

TeacherNeeds NeedsOf(const DraftSettings& draft) {
  auto algorithm = CreateDraftAlgorithm(draft, ScheduleSettings{}, at::Device(at::kCPU));
  EXPECT_TRUE(algorithm.ok()) << algorithm.status();
  auto needs = (*algorithm)->needs(TinyTarget());
  EXPECT_TRUE(needs.ok()) << needs.status();
  return *needs;
}

TEST(TeacherNeedsTest, EagleReadsItsThreeLayersAndEveryTensor) {
  DraftSettings draft;  // eagle3, soft cross-entropy
  const TeacherNeeds eagle = NeedsOf(draft);
  EXPECT_EQ(eagle.features.aux_layer_ids, (std::vector<int32_t>{1, 3, 4}));  // L = 8
  EXPECT_TRUE(eagle.features.last_hidden);
  EXPECT_TRUE(eagle.features.target_argmax);
  EXPECT_FALSE(eagle.target_head_rest);
  draft.algorithm = "eagle3.1";
  draft.aux_layer_ids = {2, 0, 1};
  draft.ttt_loss = "lk_alpha";
  const TeacherNeeds eagle31 = NeedsOf(draft);
  EXPECT_EQ(eagle31.features.aux_layer_ids, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_TRUE(eagle31.target_head_rest);
}

TEST(TeacherNeedsTest, DFlashReadsWhatItsLabelsNeed) {
  DraftSettings draft;
  draft.algorithm = "dflash";
  draft.dflash_layers = 2;
  const TeacherNeeds argmax = NeedsOf(draft);
  EXPECT_EQ(argmax.features.aux_layer_ids, (std::vector<int32_t>{1, 5}));
  EXPECT_FALSE(argmax.features.last_hidden);
  EXPECT_TRUE(argmax.features.target_argmax);
  EXPECT_TRUE(argmax.target_head_rest);
  draft.dflash_labels = "input_ids";
  const TeacherNeeds data = NeedsOf(draft);
  EXPECT_FALSE(data.features.last_hidden);
  EXPECT_FALSE(data.features.target_argmax);
  draft.dflash_labels = "target_distribution";
  const TeacherNeeds distil = NeedsOf(draft);
  EXPECT_TRUE(distil.features.last_hidden);
  EXPECT_TRUE(distil.features.target_argmax);
}

TEST(TeacherNeedsTest, ALayerTheTargetCannotServeIsRefusedNamingTheSetting) {
  DraftSettings draft;
  draft.aux_layer_ids = {1, 7};  // 7 is the last of 8 layers
  auto algorithm = CreateDraftAlgorithm(draft, ScheduleSettings{}, at::Device(at::kCPU));
  ASSERT_TRUE(algorithm.ok()) << algorithm.status();
  auto needs = (*algorithm)->needs(TinyTarget());
  EXPECT_EQ(needs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(needs.status().message().find("draft.aux_layer_ids (--aux_layer_ids) [1, 7]"), std::string::npos)
      << needs.status();
}

}  // namespace
}  // namespace e3
