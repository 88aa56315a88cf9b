#include "common/model/draft_aux_layers.h"

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace e3
