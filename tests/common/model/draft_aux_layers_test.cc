#include "common/model/draft_aux_layers.h"

#include "common/base/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

TEST(DraftAuxLayersTest, DFlashLayersSpreadOverTheTargetAsTheRecipesDo) {
  EXPECT_EQ(DFlashTargetLayerIds(36, 5), (std::vector<int32_t>{1, 9, 17, 25, 33}));  // Qwen3-8B
  EXPECT_EQ(DFlashTargetLayerIds(36, 1), (std::vector<int32_t>{18}));
  // 1 + 3.5: ties round to even, as Python's round() in SpecForge.
  EXPECT_EQ(DFlashTargetLayerIds(11, 3), (std::vector<int32_t>{1, 4, 8}));
}

TEST(DraftAuxLayersTest, ADFlashExportNamesItsTargetLayers) {
  const nlohmann::json dflash = {{"dflash_config", {{"target_layer_ids", {1, 2, 4}}, {"mask_token_id", 9}}}};
  auto ids = ReadDraftAuxLayerIds(dflash, "config.json");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 4}));
  const nlohmann::json eagle = {{"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {1, 3, 4}}}},
                                {"eagle_aux_hidden_state_layer_ids", {2, 4, 5}}};
  auto eagle_ids = ReadDraftAuxLayerIds(eagle, "config.json");
  ASSERT_TRUE(eagle_ids.ok()) << eagle_ids.status();
  EXPECT_EQ(*eagle_ids, (std::vector<int32_t>{1, 3, 4}));
}

ModelConfig EightLayers() {
  ModelConfig c;
  c.num_hidden_layers = 8;
  return c;
}

// Both services resolve a draft's layers the same way: the setting, else
// a warm start's export, else the algorithm's default for the target.
TEST(DraftAuxLayersTest, ADraftReadsItsSettingElseAWarmStartsElseTheDefault) {
  const ModelConfig target = EightLayers();
  EXPECT_EQ(DefaultDraftAuxLayerIds("eagle3", 5, target), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(DefaultDraftAuxLayerIds("eagle3.1", 5, target), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(DefaultDraftAuxLayerIds("dflash", 2, target), (std::vector<int32_t>{1, 5}));

  auto configured = DraftAuxLayerIds("eagle3", {2, 0, 1}, "", 5, target);
  ASSERT_TRUE(configured.ok()) << configured.status();
  EXPECT_EQ(*configured, (std::vector<int32_t>{2, 0, 1}));
  auto by_default = DraftAuxLayerIds("dflash", {}, "", 2, target);
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ(*by_default, (std::vector<int32_t>{1, 5}));

  const std::string dir = testing::ScratchDir("draft_aux_layers_warm_start");
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "config.json"),
                                  R"({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 6]}})")
                  .ok());
  auto warm = DraftAuxLayerIds("eagle3", {}, dir, 5, target);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_EQ(*warm, (std::vector<int32_t>{0, 2, 6}));
  auto set_wins = DraftAuxLayerIds("eagle3", {1, 3, 4}, dir, 5, target);
  ASSERT_TRUE(set_wins.ok()) << set_wins.status();
  EXPECT_EQ(*set_wins, (std::vector<int32_t>{1, 3, 4}));
}

TEST(DraftAuxLayersTest, ALayerTheServingEnginesCannotCaptureIsRefusedNamingTheSetting) {
  auto last = DraftAuxLayerIds("eagle3", {1, 7}, "", 5, EightLayers());
  EXPECT_EQ(last.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(last.status().message()),
              ::testing::HasSubstr("draft.aux_layer_ids (--aux_layer_ids) [1, 7]"));
  EXPECT_FALSE(DraftAuxLayerIds("eagle3", {1, 9}, "", 5, EightLayers()).ok());
  EXPECT_FALSE(DraftAuxLayerIds("eagle3", {}, "/nonexistent/draft", 5, EightLayers()).ok());
}

// The union keeps the first list's order (what a subscriber asking for
// everything receives), then every other layer once, ascending.
TEST(DraftAuxLayersTest, TheUnionKeepsTheFirstListsOrder) {
  EXPECT_EQ(AuxLayerUnion({{4, 1, 3}, {1, 2, 3, 4, 5}, {0}}), (std::vector<int32_t>{4, 1, 3, 0, 2, 5}));
  EXPECT_EQ(AuxLayerUnion({{1, 1, 3}}), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(AuxLayerUnion({{2, 0, 1}, {}}), (std::vector<int32_t>{2, 0, 1}));
  EXPECT_TRUE(AuxLayerUnion({}).empty());
}

}  // namespace
}  // namespace e3
