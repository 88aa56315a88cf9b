#include "student_trainer/step/dflash_blocks.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace e3 {
namespace {

// Two samples of 6 and 5 rows; the first's prompt (rows 0-1) and the
// second's row 8 are not supervised.
TeacherBatch TwoDFlashSamples() {
  TeacherBatch b;
  b.input_ids = torch::arange(100, 111, torch::kLong);
  b.cu_seqlens = torch::tensor({0, 6, 11}, torch::kLong);
  b.loss_mask = torch::tensor({0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1}, torch::kLong);
  b.target_argmax = torch::arange(200, 211, torch::kLong);
  return b;
}

std::vector<int64_t> BlockLongs(const at::Tensor& t) { return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()); }

TEST(DFlashBlocksTest, AnchorsAreSupervisedRowsWithASupervisedNextRowInTheirSample) {
  DFlashBlockOptions o;
  o.block_size = 4;
  o.mask_token_id = 7;
  auto planned = PlanDFlashBlocks(TwoDFlashSamples(), o, /*draw=*/1);
  ASSERT_TRUE(planned.ok()) << planned.status();
  // Row 5 ends sample 0 (its next row is sample 1's), row 7's next is
  // unsupervised, row 10 ends the batch.
  EXPECT_EQ(planned->blocks.anchor_rows, (std::vector<int64_t>{2, 3, 4, 6, 9}));
  EXPECT_EQ(planned->blocks.cu_seqlens, (std::vector<int64_t>{0, 6, 11}));
}

TEST(DFlashBlocksTest, BlockTokensAndLabelsOfEachKind) {
  DFlashBlockOptions o;
  o.block_size = 4;
  o.mask_token_id = 7;
  o.labels = DFlashLabels::kInputIds;
  auto by_ids = PlanDFlashBlocks(TwoDFlashSamples(), o, 1);
  ASSERT_TRUE(by_ids.ok());
  const std::vector<int64_t> tokens = BlockLongs(by_ids->block_tokens);
  const std::vector<int64_t> labels = BlockLongs(by_ids->labels);
  ASSERT_EQ(tokens.size(), 20u);
  // The block at 4: [104, M, M, M]; rows 5 (sample 0) then 6, 7 (sample 1) are past its end.
  EXPECT_EQ(std::vector<int64_t>(tokens.begin() + 8, tokens.begin() + 12), (std::vector<int64_t>{104, 7, 7, 7}));
  EXPECT_EQ(std::vector<int64_t>(labels.begin() + 8, labels.begin() + 12), (std::vector<int64_t>{-1, 105, -1, -1}));
  // The block at 6: rows 7, 8 (unsupervised), 9.
  EXPECT_EQ(std::vector<int64_t>(labels.begin() + 12, labels.begin() + 16), (std::vector<int64_t>{-1, 107, -1, 109}));
  o.labels = DFlashLabels::kTargetArgmax;
  auto by_argmax = PlanDFlashBlocks(TwoDFlashSamples(), o, 1);
  ASSERT_TRUE(by_argmax.ok());
  const std::vector<int64_t> greedy = BlockLongs(by_argmax->labels);
  // The target's argmax at row p - 1 labels row p.
  EXPECT_EQ(std::vector<int64_t>(greedy.begin() + 12, greedy.begin() + 16), (std::vector<int64_t>{-1, 206, -1, 208}));
  // Distillation labels its rows with the same argmax, and names the row
  // whose target distribution each one learns: p - 1 (0 where none).
  o.labels = DFlashLabels::kTargetDistribution;
  auto by_distribution = PlanDFlashBlocks(TwoDFlashSamples(), o, 1);
  ASSERT_TRUE(by_distribution.ok());
  EXPECT_EQ(BlockLongs(by_distribution->labels), greedy);
  const std::vector<int64_t> sources = BlockLongs(by_distribution->source_rows);
  EXPECT_EQ(std::vector<int64_t>(sources.begin() + 12, sources.begin() + 16), (std::vector<int64_t>{0, 6, 0, 8}));
  EXPECT_EQ(BlockLongs(by_ids->source_rows), sources);
}

TEST(DFlashBlocksTest, AtMostNumAnchorsDrawnBySeed) {
  TeacherBatch b;
  b.input_ids = torch::arange(0, 300, torch::kLong);
  b.cu_seqlens = torch::tensor({0, 100, 300}, torch::kLong);
  b.loss_mask = torch::ones({300}, torch::kLong);
  b.target_argmax = torch::zeros({300}, torch::kLong);
  DFlashBlockOptions o;
  o.num_anchors = 32;
  o.mask_token_id = 1;
  auto a = PlanDFlashBlocks(b, o, 5), again = PlanDFlashBlocks(b, o, 5), other = PlanDFlashBlocks(b, o, 6);
  ASSERT_TRUE(a.ok() && again.ok() && other.ok());
  const auto& rows = a->blocks.anchor_rows;
  EXPECT_EQ(rows.size(), 32u);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  EXPECT_EQ(std::set<int64_t>(rows.begin(), rows.end()).size(), 32u);
  for (int64_t r : rows) EXPECT_TRUE(r != 99 && r != 299) << "a sample's last row has no next token";
  EXPECT_EQ(rows, again->blocks.anchor_rows);
  EXPECT_NE(rows, other->blocks.anchor_rows);
}

TEST(DFlashBlocksTest, ABatchWithoutAnchorsPlansNoBlocksAndBadShapesAreNamed) {
  TeacherBatch b = TwoDFlashSamples();
  b.loss_mask = torch::zeros({11}, torch::kLong);
  DFlashBlockOptions o;
  o.mask_token_id = 7;
  auto none = PlanDFlashBlocks(b, o, 1);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->blocks.anchor_rows.empty());
  EXPECT_EQ(none->labels.numel(), 0);
  b.target_argmax = torch::zeros({5}, torch::kLong);
  b.loss_mask = torch::ones({11}, torch::kLong);
  auto bad = PlanDFlashBlocks(b, o, 1);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("target_argmax has 5 rows, not 11"), std::string::npos) << bad.status();
}

// The planned blocks through the draft and the target's embedding and
// head: the block loss falls as AdamW fits one batch.
TEST(DFlashBlocksTest, TheDraftLearnsTheBlocksOfABatch) {
  torch::manual_seed(11);
  DFlashDraftConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 64;
  c.block_size = 4;
  c.mask_token_id = 63;
  c.target_layer_ids = {1, 2, 3};
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  auto draft = CreateDFlashDraft(c, f32, 3);
  ASSERT_TRUE(draft.ok()) << draft.status();
  TeacherBatch b;
  b.input_ids = torch::randint(0, 63, {40}, torch::kLong);
  b.cu_seqlens = torch::tensor({0, 24, 40}, torch::kLong);
  b.loss_mask = torch::ones({40}, torch::kLong);
  b.target_argmax = torch::randint(0, 63, {40}, torch::kLong);
  b.aux_hidden = torch::randn({40, 3 * c.hidden_size}, f32);
  const at::Tensor embed = torch::randn({c.vocab_size, c.hidden_size}, f32);
  const at::Tensor head = torch::randn({c.vocab_size, c.hidden_size}, f32) * 0.2;
  DFlashBlockOptions o;
  o.block_size = c.block_size;
  o.num_anchors = 12;
  o.mask_token_id = c.mask_token_id;
  auto planned = PlanDFlashBlocks(b, o, /*draw=*/2);
  ASSERT_TRUE(planned.ok()) << planned.status();
  ASSERT_EQ(planned->blocks.anchor_rows.size(), 12u);
  torch::optim::AdamW adamw((*draft)->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0));
  auto loss_now = [&] {
    const at::Tensor context = (*draft)->ProjectContext(b.aux_hidden);
    const at::Tensor hidden = (*draft)->Forward(embed.index_select(0, planned->block_tokens), context, planned->blocks);
    return DFlashBlockLoss(torch::matmul(hidden, head.t()), planned->labels, c.block_size, 7.0);
  };
  const double first = loss_now().item<double>();
  for (int step = 0; step < 60; ++step) {
    adamw.zero_grad();
    at::Tensor loss = loss_now();
    loss.backward();
    adamw.step();
  }
  const double last = loss_now().item<double>();
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
}

}  // namespace
}  // namespace e3
