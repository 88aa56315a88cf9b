// The acceptance measurement's parts: verify rounds counted by hand on
// known chains, the rounds of a draft that always agrees, chains that
// depend on nothing after their row (a prefix of the sample gives the same
// chains), the first chain token equal to TTT step 0's argmax, and the
// wire form refused where its mask does not mark a continuation after a
// prompt. tools/acceptance_crosscheck.py checks whole measurements against
// drafting one token at a time with a KV cache (run on the GPU machine and
// in the e2e test).
#include <gtest/gtest.h>

#include <vector>

#include "common/torch/torch_core.h"
#include "student_trainer/eval/acceptance.h"
#include "student_trainer/step/ttt_step.h"
#include "tests/student_trainer/tiny_draft.h"

namespace e3 {
namespace {

EvalBatch OneSample(const std::vector<int64_t>& tokens, int64_t prompt) {
  EvalBatch b;
  b.input_ids = torch::tensor(tokens, torch::kLong);
  b.cu_seqlens = {0, static_cast<int64_t>(tokens.size())};
  b.prompt_lengths = {prompt};
  b.aux_hidden = torch::zeros({static_cast<int64_t>(tokens.size()), 3});
  return b;
}

// Chains that copy the data (y_i = s[t + 1 + i]) except where `wrong`
// marks (row, step) pairs.
at::Tensor Chains(const EvalBatch& b, int64_t k, const std::vector<std::pair<int64_t, int64_t>>& wrong) {
  const int64_t n = b.tokens();
  at::Tensor c = torch::full({n, k}, -1, torch::kLong);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < k && t + 2 + i < n; ++i) c[t][i] = b.input_ids[t + 2 + i];
  for (auto [t, i] : wrong) c[t][i] = 999;
  return c;
}

TEST(AcceptanceTest, RoundsCountedByHand) {
  // Prompt s0 s1; s2 came from the prefill; five tokens s3..s7 to verify.
  const EvalBatch b = OneSample({10, 11, 12, 13, 14, 15, 16, 17}, 2);
  // Round 1 from row 1: drafts s3 s4, misses s5 -> 2 accepted + bonus = 3.
  // Round 2 from row 4: drafts s6 s7, the data ends there -> 2 (no bonus).
  const at::Tensor chains = Chains(b, 3, {{1, 2}});
  const AcceptanceCounts c = CountAcceptance(chains, b, 3);
  EXPECT_EQ(c.rounds, 2);
  EXPECT_EQ(c.tokens, 5);
  EXPECT_DOUBLE_EQ(c.tau(), 2.5);
  // Chain 1 reads only the first token of each chain: 2 per round but
  // the last, which has one token left.
  const AcceptanceCounts one = CountAcceptance(chains, b, 1);
  EXPECT_EQ(one.rounds, 3);
  EXPECT_EQ(one.tokens, 5);
  // A draft that is always wrong yields one token (the bonus) per round.
  const AcceptanceCounts none = CountAcceptance(torch::full({8, 3}, 999, torch::kLong), b, 3);
  EXPECT_EQ(none.rounds, 5);
  EXPECT_DOUBLE_EQ(none.tau(), 1.0);
}

TEST(AcceptanceTest, AnAlwaysRightDraftYieldsKPlusOneTokensARound) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 40; ++i) tokens.push_back(100 + i);
  const EvalBatch b = OneSample(tokens, 5);  // 40 - 1 - 5 = 34 tokens verified
  for (int64_t k : {1, 3, 7}) {
    const AcceptanceCounts c = CountAcceptance(Chains(b, 7, {}), b, k);
    EXPECT_EQ(c.tokens, 34) << k;
    EXPECT_EQ(c.rounds, (34 + k) / (k + 1)) << k;  // ceil(34 / (k + 1))
  }
}

TEST(AcceptanceTest, ChainsDependOnNothingAfterTheirRow) {
  Eagle3Draft draft = testing::MakeTinyDraft(at::kDouble);
  const TeacherBatch ttt = testing::RandomBatch(draft->config(), {23, 9}, /*seed=*/3);
  auto full = EvalBatchFromWire(ttt.input_ids, ttt.cu_seqlens,
                                torch::cat({torch::zeros({4}), torch::ones({19}), torch::zeros({2}), torch::ones({7})}),
                                ttt.aux_hidden);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->prompt_lengths, (std::vector<int64_t>{4, 2}));
  auto chains = draft->ProposeChains(*full, 5);
  ASSERT_TRUE(chains.ok()) << chains.status();
  ASSERT_EQ(chains->sizes(), (std::vector<int64_t>{32, 5}));
  // The first 14 rows of sample 0 alone: rows 0..12 (the last has no next
  // token here) must draft the same chains.
  EvalBatch prefix = OneSample({}, 4);
  prefix.input_ids = full->input_ids.narrow(0, 0, 14);
  prefix.cu_seqlens = {0, 14};
  prefix.aux_hidden = full->aux_hidden.narrow(0, 0, 14);
  auto part = draft->ProposeChains(prefix, 5);
  ASSERT_TRUE(part.ok());
  EXPECT_TRUE(torch::equal(part->narrow(0, 0, 13), chains->narrow(0, 0, 13)));
  // Every drafted id is a target id of the draft vocab (even ids here).
  EXPECT_TRUE(torch::equal(chains->remainder(2), torch::zeros_like(*chains)));

  // The first token of each chain is TTT step 0's argmax (mapped to the
  // target vocab): the same forward on the same rows.
  TttOptions o;
  o.length = 1;
  o.keep_logits = true;
  auto out = RunTtt(*draft, ttt, o);
  ASSERT_TRUE(out.ok()) << out.status();
  const at::Tensor step0 = out->logits[0].argmax(-1) * 2;  // d2t: draft id i is target id 2i
  EXPECT_TRUE(torch::equal(step0.to(at::kLong), chains->select(1, 0)));
}

// Drafting runs without autograd, where the attention takes each sample's
// queries in row chunks bounded by SetNoGradAttentionScoreBytes: chunks of
// 3 rows (4 heads x 3 rows x 23 keys x 8 bytes) draft the same chains, in
// fp64, as one chunk per sample.
TEST(AcceptanceTest, ChunkedQueriesDraftTheSameChains) {
  Eagle3Draft draft = testing::MakeTinyDraft(at::kDouble);
  const TeacherBatch ttt = testing::RandomBatch(draft->config(), {23, 9}, /*seed=*/4);
  auto batch = EvalBatchFromWire(ttt.input_ids, ttt.cu_seqlens,
                                 torch::cat({torch::zeros({4}), torch::ones({19}), torch::zeros({2}), torch::ones({7})}),
                                 ttt.aux_hidden);
  ASSERT_TRUE(batch.ok()) << batch.status();
  auto whole = draft->ProposeChains(*batch, 7);
  ASSERT_TRUE(whole.ok()) << whole.status();
  SetNoGradAttentionScoreBytes(4 * 3 * 23 * 8);
  auto chunked = draft->ProposeChains(*batch, 7);
  SetNoGradAttentionScoreBytes(int64_t{1} << 30);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_TRUE(torch::equal(*chunked, *whole));
}

TEST(AcceptanceTest, WireFormRefusesMasksThatAreNotPromptThenContinuation) {
  const at::Tensor ids = torch::arange(6), cu = torch::tensor({0, 6}), aux = torch::zeros({6, 3});
  EXPECT_FALSE(EvalBatchFromWire(ids, cu, torch::tensor({0, 0, 1, 0, 1, 1}), aux).ok());  // a hole
  EXPECT_FALSE(EvalBatchFromWire(ids, cu, torch::tensor({1, 1, 1, 1, 1, 1}), aux).ok());  // no prompt
  EXPECT_FALSE(EvalBatchFromWire(ids, cu, torch::zeros({6}), aux).ok());                   // no continuation
  EXPECT_FALSE(EvalBatchFromWire(ids, torch::tensor({0, 5}), torch::zeros({6}), aux).ok());
  EXPECT_TRUE(EvalBatchFromWire(ids, cu, torch::tensor({0, 0, 1, 1, 1, 1}), aux).ok());
  EXPECT_EQ(ReportedChainLengths(7), (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(ReportedChainLengths(4), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(ReportedChainLengths(2), (std::vector<int64_t>{2}));
}

}  // namespace
}  // namespace e3
