// The fast TTT step (fast_step.h) against the reference op sequence on the
// CPU, where every fast op runs its ATen statement: in fp64 both compute
// the same mathematics in another order (the embedding half of q/k/v
// precomputed, attention through a log-sum-exp merge, the head over all
// steps at once, gradients accumulated in place), so everything agrees to
// fp64 rounding. Bound: 1e-10 relative to each tensor's max |value|
// (measured: about 1e-14).
#include "student_trainer/step/fast_step.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "student_trainer/step/ttt_step.h"
#include "tests/rel_inf.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

using testing::MakeTinyDraft;
using testing::RandomBatch;
using testing::TinyConfig;

using testing::RelInf;

struct Case {
  std::string name;
  std::vector<int64_t> lengths;
  int64_t ttt_length = 7;
  int64_t kv_heads = 2;
  double partial_rotary = 1.0;
  bool chat_mask = false;  // each sample's first half untrained
  bool early_mask = false;  // only each sample's first 3 positions trained
  int64_t head_chunk_rows = 8192;
  TttPositions positions = TttPositions::kAdvancing;
  TttLoss loss = TttLoss::kSoftCe;
  // No target outside the draft vocab: with no mask, each step's head rows
  // are a range, which the head reads as views.
  bool every_target_in_vocab = false;
  bool eagle31 = false;  // EAGLE-3.1: fc_norm and norm_output
};

Case Eagle31(Case k) {
  k.name += "_eagle31";
  k.eagle31 = true;
  return k;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

class TttFastTest : public ::testing::TestWithParam<Case> {};

// A batch where some targets fall outside the draft vocab (odd ids) and,
// for chat_mask, prompts are not trained.
TeacherBatch CaseBatch(const Eagle3DraftConfig& c, const Case& k) {
  TeacherBatch b = RandomBatch(c, k.lengths, /*seed=*/21);
  b.target_argmax = b.target_argmax.clone();
  for (int64_t t = 3; t < b.target_argmax.size(0) && !k.every_target_in_vocab; t += 5) b.target_argmax[t] = 1;
  int64_t begin = 0;
  for (int64_t n : k.lengths) {
    if (k.chat_mask) b.loss_mask.narrow(0, begin, n / 2).zero_();
    if (k.early_mask && n > 3) b.loss_mask.narrow(0, begin + 3, n - 3).zero_();
    begin += n;
  }
  return b;
}

TEST_P(TttFastTest, MatchesTheReferenceStepInFp64) {
  const Case& k = GetParam();
  Eagle3DraftConfig config = TinyConfig();
  config.num_kv_heads = k.kv_heads;
  config.rope.partial_rotary_factor = k.partial_rotary;
  config.fc_norm = config.norm_output = k.eagle31;
  const bool full_head = NeedsFullTargetHead(k.loss);
  Eagle3Draft ref = MakeTinyDraft(at::kDouble, /*seed=*/7, config, full_head);
  Eagle3Draft fast = MakeTinyDraft(at::kDouble, /*seed=*/7, config, full_head);
  const TeacherBatch batch = CaseBatch(config, k);

  TttOptions options;
  options.length = k.ttt_length;
  options.positions = k.positions;
  options.loss = k.loss;
  options.kl_scale = 0.7;  // away from the defaults, so a swapped factor shows
  options.kl_decay = 1.3;
  options.keep_logits = true;
  options.keep_token_losses = true;
  auto a = RunTtt(*ref, batch, options);
  ASSERT_TRUE(a.ok()) << a.status();
  a->loss.backward();
  options.kernels = TttKernels::kFast;
  options.head_chunk_rows = k.head_chunk_rows;
  fast->flat().ZeroGrad();
  auto b = RunTtt(*fast, batch, options);
  ASSERT_TRUE(b.ok()) << b.status();
  b->loss.backward();

  EXPECT_LE(RelInf(b->loss, a->loss), 1e-10);
  EXPECT_NEAR(b->loss_value, a->loss_value, 1e-10 * std::abs(a->loss_value));
  EXPECT_EQ(b->loss_tokens, a->loss_tokens);
  EXPECT_EQ(b->position_tokens, a->position_tokens);
  EXPECT_EQ(b->correct, a->correct);
  ASSERT_EQ(b->acceptance_rate.size(), a->acceptance_rate.size());
  EXPECT_EQ(a->acceptance_rate.size(), full_head ? static_cast<size_t>(k.ttt_length) : 0u);
  for (size_t j = 0; j < a->acceptance_rate.size(); ++j) {
    EXPECT_NEAR(b->acceptance_rate[j], a->acceptance_rate[j], 1e-10) << "step " << j;
  }
  ASSERT_EQ(b->logits.size(), a->logits.size());
  for (int64_t j = 0; j < k.ttt_length; ++j) {
    SCOPED_TRACE(::testing::Message() << "step " << j);
    EXPECT_NEAR(b->ploss[j], a->ploss[j], 1e-10 * std::max(std::abs(a->ploss[j]), 1e-12));
    EXPECT_LE(RelInf(b->logits[j], a->logits[j]), 1e-10);
    EXPECT_LE(RelInf(b->token_losses[j], a->token_losses[j]), 1e-10);
  }
  const auto pa = ref->ExportedParameters(), pb = fast->ExportedParameters();
  ASSERT_EQ(pa.size(), k.eagle31 ? 16u : 13u);
  for (size_t i = 0; i < pa.size(); ++i) {
    SCOPED_TRACE(pa[i].first);
    ASSERT_TRUE(pb[i].second.grad().defined());
    EXPECT_LE(RelInf(pb[i].second.grad(), pa[i].second.grad()), 1e-10);
  }
}

TEST_P(TttFastTest, SkippingUntrainedPositionsChangesNothing) {
  // Without keep_logits or keep_token_losses the head computes only the
  // rows some step trains, and the midlayer from step 1 on only the rows
  // some later step trains; against the reference step, and against the
  // fast step with every row kept.
  const Case& k = GetParam();
  Eagle3DraftConfig config = TinyConfig();
  config.num_kv_heads = k.kv_heads;
  config.rope.partial_rotary_factor = k.partial_rotary;
  config.fc_norm = config.norm_output = k.eagle31;
  const bool full_head = NeedsFullTargetHead(k.loss);
  Eagle3Draft reference = MakeTinyDraft(at::kDouble, /*seed=*/7, config, full_head);
  Eagle3Draft all_rows = MakeTinyDraft(at::kDouble, /*seed=*/7, config, full_head);
  Eagle3Draft trained_rows = MakeTinyDraft(at::kDouble, /*seed=*/7, config, full_head);
  const TeacherBatch batch = CaseBatch(config, k);
  TttOptions options;
  options.length = k.ttt_length;
  options.positions = k.positions;
  options.loss = k.loss;
  auto r = RunTtt(*reference, batch, options);
  ASSERT_TRUE(r.ok()) << r.status();
  r->loss.backward();
  options.kernels = TttKernels::kFast;
  options.head_chunk_rows = k.head_chunk_rows;
  options.keep_token_losses = true;
  auto a = RunTtt(*all_rows, batch, options);
  ASSERT_TRUE(a.ok()) << a.status();
  a->loss.backward();
  options.keep_token_losses = false;
  auto b = RunTtt(*trained_rows, batch, options);
  ASSERT_TRUE(b.ok()) << b.status();
  b->loss.backward();

  const int64_t all = a->num_tokens * k.ttt_length;
  EXPECT_EQ(a->midlayer_rows, all);
  EXPECT_EQ(r->midlayer_rows, all);
  if (k.chat_mask || k.early_mask) {
    EXPECT_LT(b->midlayer_rows, all) << "the chat mask leaves rows out";
  }
  EXPECT_LE(RelInf(b->loss, a->loss), 1e-12);
  EXPECT_LE(RelInf(b->loss, r->loss), 1e-10);
  EXPECT_EQ(b->correct, a->correct);
  EXPECT_EQ(b->correct, r->correct);
  const auto pr = reference->ExportedParameters(), pa = all_rows->ExportedParameters(),
             pb = trained_rows->ExportedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    SCOPED_TRACE(pa[i].first);
    EXPECT_LE(RelInf(pb[i].second.grad(), pa[i].second.grad()), 1e-12);
    EXPECT_LE(RelInf(pb[i].second.grad(), pr[i].second.grad()), 1e-10);
  }
}

TEST(TttFastTest, SkippingCanBeTurnedOff) {
  Eagle3Draft draft = MakeTinyDraft(at::kDouble);
  Case k{"chat", {16, 12}, 7, 2, 1.0, /*chat_mask=*/true};
  const TeacherBatch batch = CaseBatch(draft->config(), k);
  TttOptions options;
  options.kernels = TttKernels::kFast;
  auto on = RunTtt(*draft, batch, options);
  ASSERT_TRUE(on.ok()) << on.status();
  options.skip_untrained_rows = false;
  auto off = RunTtt(*draft, batch, options);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->midlayer_rows, 28 * 7);
  // Steps 1..6 keep the positions some later step trains: the trained
  // halves and the prompt positions within reach of them.
  EXPECT_LT(on->midlayer_rows, off->midlayer_rows);
  EXPECT_NEAR(on->loss_value, off->loss_value, 1e-12 * std::abs(off->loss_value));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TttFastTest,
    ::testing::Values(Case{"packed_gqa", {13, 9, 1, 6}},
                      Case{"one_sample_mha", {17}, 7, /*kv_heads=*/4},
                      Case{"mqa_ttt3", {8, 12}, 3, /*kv_heads=*/1}, Case{"ttt1", {10, 5}, 1},
                      Case{"partial_rotary", {11, 7}, 7, 2, /*partial_rotary=*/0.5},
                      Case{"chat_masks", {16, 12, 9}, 7, 2, 1.0, /*chat_mask=*/true},
                      Case{"small_head_chunks", {13, 9, 6}, 7, 2, 1.0, true, false,
                           /*head_chunk_rows=*/5},
                      Case{"early_masks_only", {12, 9}, 7, 2, 1.0, false, /*early_mask=*/true},
                      Case{"fixed_positions_chat", {14, 10}, 7, 2, 1.0, true, false, 8192,
                           TttPositions::kFixed},
                      Case{"lk_alpha_chat", {13, 9, 1, 6}, 7, 2, 1.0, true, false, 8192,
                           TttPositions::kAdvancing, TttLoss::kLkAlpha},
                      Case{"lk_lambda_small_head_chunks", {13, 9, 6}, 7, 2, 1.0, false, false,
                           /*head_chunk_rows=*/5, TttPositions::kAdvancing, TttLoss::kLkLambda},
                      Case{"lk_lambda_early_masks", {12, 9}, 5, 1, 0.5, false, true, 8192,
                           TttPositions::kAdvancing, TttLoss::kLkLambda},
                      // Range steps: interleaved chunks of 1-2 rows per step (10-row
                      // chunks, 7 steps), of every row in one chunk, an LK loss over
                      // them; and 5-row chunks, too few for 7 steps: each step's rows
                      // in chunks of their own.
                      Case{"one_sample_every_position_trained", {23}, 7, 2, 1.0, false, false,
                           /*head_chunk_rows=*/10, TttPositions::kAdvancing, TttLoss::kSoftCe,
                           /*every_target_in_vocab=*/true},
                      Case{"one_sample_every_position_trained_one_chunk", {23}, 7, 2, 1.0, false, false,
                           8192, TttPositions::kAdvancing, TttLoss::kSoftCe, true},
                      Case{"one_sample_every_position_trained_lk_lambda", {19}, 5, 2, 1.0, false, false,
                           /*head_chunk_rows=*/12, TttPositions::kAdvancing, TttLoss::kLkLambda, true},
                      Case{"one_sample_every_position_trained_chunks_per_step", {23}, 7, 2, 1.0, false,
                           false, /*head_chunk_rows=*/5, TttPositions::kAdvancing, TttLoss::kSoftCe, true},
                      Eagle31(Case{"packed_gqa", {13, 9, 1, 6}}),
                      Eagle31(Case{"chat_masks", {16, 12, 9}, 7, 2, 1.0, true}),
                      Eagle31(Case{"small_head_chunks", {13, 9, 6}, 7, 2, 1.0, true, false, 5}),
                      Eagle31(Case{"lk_lambda_early_masks", {12, 9}, 5, 1, 0.5, false, true, 8192,
                                   TttPositions::kAdvancing, TttLoss::kLkLambda}),
                      Eagle31(Case{"one_sample_every_position_trained", {23}, 7, 2, 1.0, false, false, 10,
                                   TttPositions::kAdvancing, TttLoss::kSoftCe, true})),
    CaseName);

TEST(TttFastTest, GradientsAccumulateUntilZeroed) {
  Eagle3Draft draft = MakeTinyDraft(at::kDouble);
  const TeacherBatch batch = RandomBatch(draft->config(), {9, 7}, /*seed=*/3);
  TttOptions options;
  options.kernels = TttKernels::kFast;
  draft->flat().ZeroGrad();
  auto once = RunTtt(*draft, batch, options);
  ASSERT_TRUE(once.ok()) << once.status();
  once->loss.backward();
  const at::Tensor g1 = draft->flat().grad().clone();
  auto twice = RunTtt(*draft, batch, options);
  ASSERT_TRUE(twice.ok()) << twice.status();
  twice->loss.backward();
  EXPECT_LE(RelInf(draft->flat().grad(), 2 * g1), 1e-12);
  draft->flat().ZeroGrad();
  EXPECT_EQ(draft->flat().grad().abs().max().item<double>(), 0.0);
}

// The head scales its saved hidden-state gradients in place by the loss's
// output gradient; a scaled loss scales every gradient, and a second
// backward through the same graph is refused by name.
TEST(TttFastTest, AScaledLossScalesEveryGradient) {
  Eagle3Draft draft = MakeTinyDraft(at::kDouble);
  const TeacherBatch batch = RandomBatch(draft->config(), {11, 6}, /*seed=*/4);
  TttOptions options;
  options.kernels = TttKernels::kFast;
  draft->flat().ZeroGrad();
  auto plain = RunTtt(*draft, batch, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  plain->loss.backward();
  const at::Tensor g1 = draft->flat().grad().clone();
  draft->flat().ZeroGrad();
  auto scaled = RunTtt(*draft, batch, options);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  const at::Tensor loss = scaled->loss * 0.37;
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_LE(RelInf(draft->flat().grad(), 0.37 * g1), 1e-12);
  try {
    loss.backward();
    ADD_FAILURE() << "a second backward ran";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward ran twice"), std::string::npos) << e.what();
  }
}

TEST(TttFastTest, DeferredMetricsResolveToTheSameValues) {
  Eagle3Draft draft = MakeTinyDraft(at::kDouble);
  const TeacherBatch batch = RandomBatch(draft->config(), {9, 7}, /*seed=*/4);
  TttOptions options;
  options.kernels = TttKernels::kFast;
  auto now = RunTtt(*draft, batch, options);
  ASSERT_TRUE(now.ok()) << now.status();
  options.defer_metrics = true;
  auto later = RunTtt(*draft, batch, options);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_TRUE(later->acc.empty());
  ResolveTttMetrics(&*later);
  EXPECT_EQ(later->correct, now->correct);
  EXPECT_EQ(later->ploss, now->ploss);
  EXPECT_EQ(later->tau, now->tau);
  EXPECT_EQ(later->loss_value, now->loss_value);
}

TEST(TttFastTest, BadBatchesAreErrorsNamingTheField) {
  Eagle3Draft draft = MakeTinyDraft();
  TeacherBatch b = RandomBatch(draft->config(), {6, 4}, /*seed=*/9);
  b.input_ids = b.input_ids.clone();
  b.input_ids[2] = 50;  // == vocab_size
  TttOptions options;
  options.kernels = TttKernels::kFast;
  auto out = RunTtt(*draft, b, options);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(out.status().message()).find("input_ids"), std::string::npos)
      << out.status();
}

// The fast step reads cu_seqlens and the target's argmax on the host
// (its plan), after it has queued the target and fc: bad values are
// still errors naming the field, whatever their integer type.
TEST(TttFastTest, BadPackingAndTargetIdsAreErrorsNamingTheField) {
  Eagle3Draft draft = MakeTinyDraft();
  const TeacherBatch good = RandomBatch(draft->config(), {6, 4}, /*seed=*/9);
  TttOptions options;
  options.kernels = TttKernels::kFast;
  auto expect_error = [&](const TeacherBatch& b, const std::string& field, const std::string& what) {
    auto out = RunTtt(*draft, b, options);
    ASSERT_FALSE(out.ok()) << field;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(out.status().message());
    EXPECT_NE(message.find(field), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  };
  TeacherBatch b = good;
  b.cu_seqlens = torch::tensor(std::vector<int32_t>{0, 6, 9});
  expect_error(b, "cu_seqlens", "end at T = 10");
  b.cu_seqlens = torch::tensor(std::vector<int64_t>{0, 7, 6, 10});
  expect_error(b, "cu_seqlens", "decreases at index 2");
  b = good;
  b.target_argmax = good.target_argmax.to(at::kInt).clone();
  b.target_argmax[9] = -1;
  expect_error(b, "target_argmax", "min -1");
  // The same batch with every integer field as int32 and a float mask
  // trains as the int64 one.
  b = good;
  b.input_ids = good.input_ids.to(at::kInt);
  b.cu_seqlens = good.cu_seqlens.to(at::kInt);
  b.target_argmax = good.target_argmax.to(at::kInt);
  b.loss_mask = good.loss_mask.to(at::kFloat);
  auto narrow_types = RunTtt(*draft, b, options);
  auto wide_types = RunTtt(*draft, good, options);
  ASSERT_TRUE(narrow_types.ok()) << narrow_types.status();
  ASSERT_TRUE(wide_types.ok()) << wide_types.status();
  EXPECT_EQ(narrow_types->loss_value, wide_types->loss_value);
  EXPECT_EQ(narrow_types->correct, wide_types->correct);
}

TEST(TttFastTest, AdvancingPositionsChangeTheLaterStepsOnly) {
  // Step 0 sits at the same positions either way; later steps do not.
  Eagle3Draft draft = MakeTinyDraft(at::kDouble);
  const TeacherBatch batch = RandomBatch(draft->config(), {12, 9}, /*seed=*/6);
  TttOptions options;
  options.kernels = TttKernels::kFast;
  options.keep_logits = true;
  auto advancing = RunTtt(*draft, batch, options);
  options.positions = TttPositions::kFixed;
  auto fixed = RunTtt(*draft, batch, options);
  ASSERT_TRUE(advancing.ok() && fixed.ok());
  EXPECT_LE(RelInf(advancing->logits[0], fixed->logits[0]), 1e-12);
  for (int64_t j = 1; j < 7; ++j)
    EXPECT_GT(RelInf(advancing->logits[j], fixed->logits[j]), 1e-6) << j;
}

// The LK losses' expected acceptance rate of step 0, from its definition:
// the target's full-vocabulary softmax (every row of the target head) at
// the draft vocab's ids, against softmax of the draft's logits.
TEST(TttFastTest, LkAcceptanceRateIsItsDefinition) {
  const Eagle3DraftConfig config = TinyConfig();
  const Eagle3FrozenTensors frozen = testing::TinyFrozen(config, /*seed=*/11);
  TeacherBatch batch = RandomBatch(config, {11, 8}, /*seed=*/5);
  batch.loss_mask[4] = 0;
  for (TttKernels kernels : {TttKernels::kReference, TttKernels::kFast}) {
    SCOPED_TRACE(kernels == TttKernels::kFast ? "fast" : "reference");
    Eagle3Draft draft = MakeTinyDraft(at::kDouble, /*seed=*/7, config, /*keep_full_target_head=*/true);
    TttOptions options;
    options.kernels = kernels;
    options.loss = TttLoss::kLkAlpha;
    options.keep_logits = true;
    auto out = RunTtt(*draft, batch, options);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->acceptance_rate.size(), 7u);

    const at::Tensor full = at::softmax(batch.last_hidden.to(at::kDouble).matmul(
                                            frozen.target_lm_head.to(at::kDouble).t()), -1);
    const at::Tensor draft_ids = torch::arange(config.draft_vocab_size, torch::kLong) * 2;  // EvenIdsVocab
    const at::Tensor q = at::softmax(out->logits[0], -1);
    double sum = 0, trained = 0;
    for (int64_t t = 0; t < 19; ++t) {
      const int64_t end = t < 11 ? 11 : 19;
      if (t + 1 >= end || batch.loss_mask[t].item<int>() == 0) continue;  // no next token / untrained
      const at::Tensor p = full[t + 1].index_select(0, draft_ids);
      sum += at::minimum(p, q[t]).sum().item<double>();
      trained += 1;
    }
    EXPECT_NEAR(out->acceptance_rate[0], sum / trained, 1e-12);
    EXPECT_GT(out->acceptance_rate[0], 0.0);
    EXPECT_LT(out->acceptance_rate[0], 1.0);
  }
}

TEST(TttFastTest, LkLossesNeedTheFullTargetHead) {
  Eagle3Draft draft = MakeTinyDraft(at::kDouble);  // draft rows only
  const TeacherBatch batch = RandomBatch(draft->config(), {9, 7}, /*seed=*/3);
  TttOptions options;
  options.loss = TttLoss::kLkLambda;
  for (TttKernels kernels : {TttKernels::kReference, TttKernels::kFast}) {
    options.kernels = kernels;
    auto out = RunTtt(*draft, batch, options);
    ASSERT_FALSE(out.ok());
    EXPECT_NE(std::string(out.status().message()).find("keep_full_target_head"), std::string::npos)
        << out.status();
  }
}

TEST(TttFastTest, KernelNamesParse) {
  EXPECT_EQ(*ParseTttKernels("fast"), TttKernels::kFast);
  EXPECT_EQ(*ParseTttKernels("reference"), TttKernels::kReference);
  auto bad = ParseTttKernels("fused");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("--student_kernels"), std::string::npos);
  EXPECT_EQ(*ParseTttPositions("advancing"), TttPositions::kAdvancing);
  EXPECT_EQ(*ParseTttPositions("fixed"), TttPositions::kFixed);
  auto bad_positions = ParseTttPositions("t+j");
  ASSERT_FALSE(bad_positions.ok());
  EXPECT_NE(std::string(bad_positions.status().message()).find("--ttt_positions"),
            std::string::npos);
  EXPECT_EQ(*ParseTttLoss("soft_ce"), TttLoss::kSoftCe);
  EXPECT_EQ(*ParseTttLoss("lk_alpha"), TttLoss::kLkAlpha);
  EXPECT_EQ(*ParseTttLoss("lk_lambda"), TttLoss::kLkLambda);
  auto bad_loss = ParseTttLoss("lk");
  ASSERT_FALSE(bad_loss.ok());
  EXPECT_NE(std::string(bad_loss.status().message()).find("--ttt_loss"), std::string::npos);
}

}  // namespace
}  // namespace e3
