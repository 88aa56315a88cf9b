// The fast step's plan (student_trainer/step/step_plan.h) against the TTT
// semantics written out position by position: on packed samples with
// random masks and a draft vocab that leaves out some target tokens, each
// step's embedding rows (distinct, padding rows of the sample's own past
// its end), trained head rows and their targets, the midlayer rows a
// chat-like mask leaves, the token counts and cu_seqlens; and the CPU
// upload's views.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <vector>

#include "common/torch/torch_core.h"
#include "student_trainer/step/step_plan.h"

namespace e3 {
namespace {

struct PlanCase {
  std::vector<int64_t> cu;
  TttHostBatch batch;
  std::vector<uint8_t> t2d;
};

// `prompt_fraction` of each sample's first positions carry loss mask 0,
// the rest a random mask that is mostly 1.
PlanCase MakeCase(std::vector<int64_t> cu, double prompt_fraction, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  PlanCase c;
  c.cu = std::move(cu);
  const int64_t T = c.cu.back();
  c.batch.ids = torch::randint(vocab, {T}, torch::kLong);
  c.batch.top = torch::randint(vocab, {T}, torch::kLong);
  at::Tensor mask = torch::rand({T}) < 0.9;
  for (size_t s = 0; s + 1 < c.cu.size(); ++s) {
    const int64_t n = c.cu[s + 1] - c.cu[s];
    mask.narrow(0, c.cu[s], static_cast<int64_t>(prompt_fraction * n)).fill_(false);
  }
  c.batch.mask = mask.contiguous();
  c.t2d.resize(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) c.t2d[static_cast<size_t>(v)] = v % 5 != 0;  // a fifth not in the draft vocab
  return c;
}

std::vector<int64_t> Longs(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The semantics, per position: step j at position t predicts the token at
// t + j + 2 (its target row is t + j + 1) and trains where the loss mask
// of t + j holds, t + j + 1 is inside the sample and the target's token
// there is in the draft vocab.
struct Expected {
  int64_t end, sample, start;
  bool trained(const PlanCase& c, int64_t t, int64_t j) const {
    const int64_t u = t + j;
    if (u + 1 >= end) return false;
    const int64_t top_next = c.batch.top[u + 1].item<int64_t>();
    return c.batch.mask[u].item<bool>() && c.t2d[static_cast<size_t>(top_next)] != 0;
  }
};

Expected Where(const PlanCase& c, int64_t t) {
  for (size_t s = 0; s + 1 < c.cu.size(); ++s) {
    if (t < c.cu[s + 1]) return {c.cu[s + 1], static_cast<int64_t>(s), c.cu[s]};
  }
  return {};
}

void CheckPlan(const PlanCase& c, const TttOptions& options) {
  const TttPlan plan = MakeTttPlan(c.t2d, c.batch, c.cu, options);
  const TttDevicePlan d = UploadTttPlan(plan, at::Device(at::kCPU), at::kFloat, options.step_weight);
  const int64_t T = c.cu.back(), L = options.length;
  ASSERT_EQ(plan.tokens, T);
  ASSERT_EQ(plan.pad_rows, static_cast<int64_t>(c.cu.size() - 1) * L);

  const std::vector<int64_t> ext = Longs(d.ext_ids);
  ASSERT_EQ(static_cast<int64_t>(ext.size()), T + plan.pad_rows);
  EXPECT_EQ(std::vector<int64_t>(ext.begin(), ext.begin() + T), Longs(c.batch.ids));
  for (int64_t r = T; r < T + plan.pad_rows; ++r) EXPECT_EQ(ext[r], 0) << "padding row " << r;
  EXPECT_EQ(Longs(d.cu_seqlens), c.cu);

  std::vector<int64_t> prev_mid;
  for (int64_t j = 0; j < L; ++j) {
    SCOPED_TRACE(::testing::Message() << "step " << j);
    // The midlayer's rows: every position at step 0 and wherever the rows
    // are not compacted; else exactly the positions some step >= j trains.
    std::vector<int64_t> mid;
    if (plan.compacted(j)) {
      ASSERT_GT(j, 0);
      mid = Longs(d.mid_positions[j]);
      std::vector<int64_t> expected;
      for (int64_t t = 0; t < T; ++t) {
        bool later = false;
        for (int64_t k = j; k < L; ++k) later = later || Where(c, t).trained(c, t, k);
        if (later) expected.push_back(t);
      }
      if (expected.empty()) expected.push_back(prev_mid.front());
      EXPECT_EQ(mid, expected);
      const std::vector<int64_t> from_prev = Longs(d.mid_from_prev[j]);
      for (size_t i = 0; i < mid.size(); ++i) EXPECT_EQ(prev_mid[static_cast<size_t>(from_prev[i])], mid[i]);
    } else {
      for (int64_t t = 0; t < T; ++t) mid.push_back(t);
    }
    // Embedding rows: position t + j + 1 inside the sample, else the
    // sample's own padding row for that overshoot; never twice in a step.
    const std::vector<int64_t> embed = Longs(d.embed_rows[j]);
    ASSERT_EQ(embed.size(), mid.size());
    std::set<int64_t> seen;
    for (size_t i = 0; i < mid.size(); ++i) {
      const int64_t t = mid[i], next = t + j + 1;
      const Expected w = Where(c, t);
      const int64_t want = next < w.end ? next : T + w.sample * L + (next - w.end);
      EXPECT_EQ(embed[i], want) << "position " << t;
      EXPECT_TRUE(seen.insert(embed[i]).second) << "row " << embed[i] << " twice";
    }
    bool embed_range = !embed.empty();
    for (size_t i = 0; i < embed.size(); ++i) embed_range = embed_range && embed[i] == embed[0] + static_cast<int64_t>(i);
    EXPECT_EQ(d.embed_first_row[j], embed_range ? embed[0] : -1) << "step " << j;
    // Head rows: the trained positions (as indices among the midlayer's
    // rows), their target rows and weight 1; the counts.
    const std::vector<int64_t> head = Longs(d.head[j].rows), target = Longs(d.head[j].target_rows);
    std::vector<int64_t> want_positions, want_targets;
    int64_t loss_tokens = 0;
    for (int64_t t = 0; t < T; ++t) {
      const Expected w = Where(c, t);
      if (t + j + 1 < w.end && c.batch.mask[t + j].item<bool>()) ++loss_tokens;
      if (!w.trained(c, t, j)) continue;
      want_positions.push_back(t);
      want_targets.push_back(t + j + 1);
    }
    std::vector<int64_t> head_positions;
    for (int64_t r : head) head_positions.push_back(mid[static_cast<size_t>(r)]);
    EXPECT_EQ(head_positions, want_positions);
    // A range is said to be one exactly when it is.
    bool range = !head.empty();
    for (size_t i = 0; i < head.size(); ++i) range = range && head[i] == head[0] + static_cast<int64_t>(i);
    EXPECT_EQ(d.head[j].first_row, range ? head[0] : -1);
    EXPECT_EQ(target, want_targets);
    EXPECT_TRUE(d.head[j].row_weight.eq(1).all().item<bool>());
    EXPECT_EQ(d.head[j].trained_positions, static_cast<int64_t>(want_positions.size()));
    EXPECT_EQ(d.counts[j][0].item<int64_t>(), loss_tokens);
    EXPECT_EQ(d.counts[j][1].item<int64_t>(), static_cast<int64_t>(want_positions.size()));
    prev_mid = mid;
  }
  const std::vector<int64_t> positions = Longs(d.positions);
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(positions[t], t - Where(c, t).start);
}

TEST(TttPlanTest, PackedSamplesEveryRow) {
  TttOptions o;
  o.length = 4;
  CheckPlan(MakeCase({0, 9, 13, 14, 30}, 0.0, 40, 1), o);
}

TEST(TttPlanTest, ChatMaskCompactsTheMidlayerRows) {
  TttOptions o;
  o.length = 5;
  const PlanCase c = MakeCase({0, 40, 64, 100}, 0.5, 50, 2);
  const TttPlan plan = MakeTttPlan(c.t2d, c.batch, c.cu, o);
  ASSERT_TRUE(plan.compacted(1)) << "the case should leave rows out";
  CheckPlan(c, o);
}

TEST(TttPlanTest, KeepingLogitsKeepsEveryRowWithWeights) {
  TttOptions o;
  o.length = 3;
  o.keep_logits = true;
  const PlanCase c = MakeCase({0, 20, 32}, 0.5, 30, 3);
  const TttPlan plan = MakeTttPlan(c.t2d, c.batch, c.cu, o);
  const TttDevicePlan d = UploadTttPlan(plan, at::Device(at::kCPU), at::kDouble, o.step_weight);
  for (int64_t j = 0; j < o.length; ++j) {
    EXPECT_FALSE(plan.compacted(j));
    ASSERT_EQ(d.head[j].rows.numel(), 32);
    EXPECT_EQ(d.head[j].row_weight.scalar_type(), at::kDouble);
    for (int64_t t = 0; t < 32; ++t) {
      const double w = d.head[j].row_weight[t].item<double>();
      EXPECT_EQ(w, Where(c, t).trained(c, t, j) ? 1.0 : 0.0) << "step " << j << " position " << t;
    }
  }
  EXPECT_DOUBLE_EQ(d.head[2].step_weight, o.step_weight * o.step_weight);
}

// How long the host plans a 16k-token batch (printed, not asserted: the
// GPU waits for this when it exceeds the work queued before it).
TEST(TttPlanTest, PlansSixteenThousandTokens) {
  TttOptions o;
  const PlanCase c = MakeCase({0, 16384}, 0.0, 32000, 4);
  TttPlan plan = MakeTttPlan(c.t2d, c.batch, c.cu, o);  // first touch of the allocator's pages
  const auto start = std::chrono::steady_clock::now();
  constexpr int kRepeats = 5;
  for (int i = 0; i < kRepeats; ++i) plan = MakeTttPlan(c.t2d, c.batch, c.cu, o);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / kRepeats;
  std::printf("MakeTttPlan: 16384 tokens, TTT 7: %.2f ms, %zu int64 to upload\n", ms, plan.longs.size());
  EXPECT_EQ(plan.tokens, 16384);
}

// One sample, every position trained: each step's head rows are the range
// of positions that still have a target, which the head reads as views.
TEST(TttPlanTest, EveryPositionTrainedGivesRanges) {
  TttOptions o;
  o.length = 4;
  PlanCase c = MakeCase({0, 50}, 0.0, 30, 5);
  c.batch.mask.fill_(true);
  std::fill(c.t2d.begin(), c.t2d.end(), 1);
  const TttPlan plan = MakeTttPlan(c.t2d, c.batch, c.cu, o);
  const TttDevicePlan d = UploadTttPlan(plan, at::Device(at::kCPU), at::kFloat, o.step_weight);
  for (int64_t j = 0; j < o.length; ++j) {
    EXPECT_EQ(d.head[j].first_row, 0);
    EXPECT_EQ(d.head[j].rows.numel(), 50 - j - 1);
    // Position t reads embedding row t + j + 1 (its own padding row past
    // the end): the range [j + 1, j + 51).
    EXPECT_EQ(d.embed_first_row[j], j + 1);
  }
  CheckPlan(c, o);
}

}  // namespace
}  // namespace e3
