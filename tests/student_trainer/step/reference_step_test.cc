// Unit checks of the TTT forward and loss beyond the golden comparison:
// packing isolates samples, masks are respected, bad batches are errors,
// and optimisation on a fixed batch lowers the loss without touching the
// frozen tensors.
#include "student_trainer/step/ttt_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

using testing::MakeTinyDraft;
using testing::RandomBatch;
using testing::SliceSample;
using testing::TinyConfig;

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(TttTest, PackedSamplesMatchSeparateRuns) {
  // fp64 so that any leak across samples, however small, shows.
  Eagle3Draft draft = MakeTinyDraft(at::kDouble);
  const std::vector<int64_t> lengths = {13, 9, 1, 6};
  TeacherBatch packed = RandomBatch(draft->config(), lengths, /*seed=*/3);
  TttOptions options;
  options.keep_logits = true;
  options.keep_token_losses = true;
  auto all = RunTtt(*draft, packed, options);
  ASSERT_TRUE(all.ok()) << all.status();

  int64_t begin = 0;
  std::vector<int64_t> correct(options.length, 0), loss_tokens(options.length, 0);
  double weighted_sum = 0;
  for (int64_t n : lengths) {
    SCOPED_TRACE(::testing::Message() << "sample at " << begin);
    auto one = RunTtt(*draft, SliceSample(packed, begin, n), options);
    ASSERT_TRUE(one.ok()) << one.status();
    for (int64_t j = 0; j < options.length; ++j) {
      EXPECT_LT(MaxAbsDiff(all->logits[j].narrow(0, begin, n), one->logits[j]), 1e-12)
          << "step " << j;
      EXPECT_LT(MaxAbsDiff(all->token_losses[j].narrow(0, begin, n), one->token_losses[j]), 1e-12)
          << "step " << j;
      correct[j] += one->correct[j];
      loss_tokens[j] += one->loss_tokens[j];
    }
    // ploss is a mean over the batch's T positions, so sums add up.
    weighted_sum += one->loss.item<double>() * static_cast<double>(n);
    begin += n;
  }
  EXPECT_EQ(all->correct, correct);
  EXPECT_EQ(all->loss_tokens, loss_tokens);
  EXPECT_NEAR(all->loss.item<double>() * static_cast<double>(all->num_tokens), weighted_sum, 1e-9);
}

TEST(TttTest, LastPositionOfEachSampleIsNeverTrained) {
  Eagle3Draft draft = MakeTinyDraft();
  const std::vector<int64_t> lengths = {8, 3, 5};
  auto out = RunTtt(*draft, RandomBatch(draft->config(), lengths, /*seed=*/4));
  ASSERT_TRUE(out.ok()) << out.status();
  // All positions are trained and all target argmaxes are in the draft
  // vocab, so step j trains max(n - 1 - j, 0) positions of each sample.
  for (int64_t j = 0; j < 7; ++j) {
    int64_t expected = 0;
    for (int64_t n : lengths) expected += std::max<int64_t>(n - 1 - j, 0);
    EXPECT_EQ(out->loss_tokens[j], expected) << "step " << j;
    EXPECT_EQ(out->position_tokens[j], expected) << "step " << j;
  }
}

TEST(TttTest, PositionMaskDropsTargetsOutsideTheDraftVocab) {
  Eagle3Draft draft = MakeTinyDraft();
  TeacherBatch batch = RandomBatch(draft->config(), {10}, /*seed=*/5);
  // Odd ids are outside the draft vocab. Position t learns the target of
  // t + 1 + j at step j, so an odd argmax at 4 masks position 3 at step
  // 0, position 2 at step 1, ..., and nothing else.
  batch.target_argmax[4] = 7;
  TttOptions options;
  options.keep_token_losses = true;
  auto out = RunTtt(*draft, batch, options);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int64_t j = 0; j < 4; ++j) {
    EXPECT_EQ(out->token_losses[j][3 - j].item<double>(), 0.0) << "step " << j;
    EXPECT_GT(out->token_losses[j][5].item<double>(), 0.0) << "step " << j;
    EXPECT_EQ(out->position_tokens[j], out->loss_tokens[j] - 1) << "step " << j;
  }
  // Once the odd target has shifted out, nothing is dropped.
  EXPECT_EQ(out->position_tokens[4], out->loss_tokens[4]);
}

TEST(TttTest, AllZeroLossMaskGivesZeroLossAndFiniteZeroGradients) {
  Eagle3Draft draft = MakeTinyDraft();
  TeacherBatch batch = RandomBatch(draft->config(), {7, 5}, /*seed=*/6);
  batch.loss_mask = torch::zeros({12}, torch::kBool);
  auto out = RunTtt(*draft, batch);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->loss.item<double>(), 0.0);
  for (int64_t j = 0; j < 7; ++j) {
    EXPECT_EQ(out->ploss[j], 0.0);
    EXPECT_EQ(out->acc[j], 0.0);
    EXPECT_EQ(out->loss_tokens[j], 0);
  }
  EXPECT_EQ(out->tau, 1.0);
  out->loss.backward();
  for (const auto& [name, p] : draft->ExportedParameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << name;
    EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0) << name;
  }
}

TEST(TttTest, AdamStepsOnAFixedBatchLowerTheLossAndLeaveFrozenTensorsAlone) {
  Eagle3Draft draft = MakeTinyDraft();
  TeacherBatch batch = RandomBatch(draft->config(), {12, 7}, /*seed=*/8);
  const at::Tensor head_before = draft->target_head.clone();
  const at::Tensor embed_before = draft->embed_tokens.clone();
  std::vector<at::Tensor> params;
  for (auto& item : draft->ExportedParameters()) params.push_back(item.second);
  ASSERT_EQ(params.size(), 13u);
  torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-2));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    adam.zero_grad();
    auto out = RunTtt(*draft, batch);
    ASSERT_TRUE(out.ok()) << out.status();
    out->loss.backward();
    adam.step();
    if (step == 0) first = out->loss.item<double>();
    last = out->loss.item<double>();
  }
  EXPECT_LT(last, 0.7 * first) << "first " << first << ", last " << last;
  // lm_head starts as a copy of the target head rows, never an alias.
  EXPECT_TRUE(draft->target_head.equal(head_before));
  EXPECT_TRUE(draft->embed_tokens.equal(embed_before));
}

TEST(TttTest, LmHeadStartsAsTheTargetHeadRows) {
  Eagle3Draft draft = MakeTinyDraft();
  auto frozen = testing::TinyFrozen(TinyConfig(), 11);
  // Draft id i is target id 2i.
  at::Tensor rows = frozen.target_lm_head.index_select(0, torch::arange(20, torch::kLong) * 2);
  EXPECT_TRUE(draft->lm_head->weight.equal(rows));
  EXPECT_TRUE(draft->target_head.equal(rows));
  EXPECT_NE(draft->lm_head->weight.data_ptr(), draft->target_head.data_ptr());
}

TEST(TttTest, InitIsDeterministicInTheSeed) {
  Eagle3Draft a = MakeTinyDraft(at::kFloat, /*seed=*/1);
  Eagle3Draft b = MakeTinyDraft(at::kFloat, /*seed=*/1);
  Eagle3Draft c = MakeTinyDraft(at::kFloat, /*seed=*/2);
  auto pa = a->ExportedParameters(), pb = b->ExportedParameters(), pc = c->ExportedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(pa[i].second.equal(pb[i].second)) << pa[i].first;
  }
  EXPECT_FALSE(pa[0].second.equal(pc[0].second));  // fc.weight
  // Norms start at one, as in HF.
  EXPECT_TRUE(a->norm->weight.equal(torch::ones({32})));
}

TEST(TttTest, BadBatchesAreErrorsNamingTheField) {
  Eagle3Draft draft = MakeTinyDraft();
  const TeacherBatch good = RandomBatch(draft->config(), {6, 4}, /*seed=*/9);
  {
    TeacherBatch b = good;
    b.aux_hidden = b.aux_hidden.narrow(1, 0, 32);
    auto out = RunTtt(*draft, b);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(out.status().message()).find("aux_hidden"), std::string::npos)
        << out.status();
  }
  {
    TeacherBatch b = good;
    b.cu_seqlens = torch::tensor(std::vector<int64_t>{0, 6, 9});
    auto out = RunTtt(*draft, b);
    ASSERT_FALSE(out.ok());
    EXPECT_NE(std::string(out.status().message()).find("cu_seqlens"), std::string::npos)
        << out.status();
  }
  {
    TeacherBatch b = good;
    b.input_ids = b.input_ids.clone();
    b.input_ids[2] = 50;  // == vocab_size
    auto out = RunTtt(*draft, b);
    ASSERT_FALSE(out.ok());
    EXPECT_NE(std::string(out.status().message()).find("input_ids"), std::string::npos)
        << out.status();
  }
  {
    TeacherBatch b = good;
    b.target_argmax = b.target_argmax.to(at::kFloat);
    auto out = RunTtt(*draft, b);
    ASSERT_FALSE(out.ok());
    EXPECT_NE(std::string(out.status().message()).find("target_argmax"), std::string::npos)
        << out.status();
  }
}

TEST(TttTest, SimulatedAcceptanceLength) {
  EXPECT_DOUBLE_EQ(SimulatedAcceptanceLength({}), 1.0);
  EXPECT_DOUBLE_EQ(SimulatedAcceptanceLength({1.0, 1.0, 1.0}), 4.0);
  EXPECT_DOUBLE_EQ(SimulatedAcceptanceLength({0.5, 0.5}), 1.75);
  EXPECT_DOUBLE_EQ(SimulatedAcceptanceLength({0.0, 1.0}), 1.0);
}

TEST(TttTest, CreateRejectsInconsistentInput) {
  Eagle3DraftOptions options;
  options.config = TinyConfig();
  auto frozen = testing::TinyFrozen(options.config, 1);
  {
    Eagle3DraftOptions o = options;
    o.config.hidden_size = 16;
    auto d = CreateEagle3Draft(o, frozen);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(std::string(d.status().message()).find("hidden_size"), std::string::npos)
        << d.status();
  }
  {
    auto f = frozen;
    f.embed_tokens = f.embed_tokens.narrow(0, 0, 10);
    auto d = CreateEagle3Draft(options, f);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(std::string(d.status().message()).find("embed_tokens"), std::string::npos)
        << d.status();
  }
  {
    auto f = frozen;
    f.vocab = testing::EvenIdsVocab(50, 10);
    auto d = CreateEagle3Draft(options, f);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(std::string(d.status().message()).find("vocab"), std::string::npos) << d.status();
  }
}

}  // namespace
}  // namespace e3
