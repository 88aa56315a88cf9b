// The real acceptance length tau of the draft, measured as a serving
// engine's EAGLE-3 chain speculation would see it against the teacher's
// greedy continuations (teacher_server/data/eval_set.h), with the draft's
// current weights.
//
// SGLang's chain mode (speculative_eagle_topk = 1, speculative_num_steps =
// K; sglang/srt/speculative/eagle_worker.py: forward_draft_extend,
// draft_forward, verify, forward_draft_extend_after_decode):
// - the draft extends over the verified tokens with the target's hidden
//   states: row r pairs the target's aux states at r with token r + 1, at
//   rope position r;
// - a round from row t drafts K tokens: the first is the argmax of row t's
//   extend output; each later step feeds the previous token's embedding
//   and the previous step's pre-norm output, one position further on,
//   attending to the extended rows <= t and the round's own steps;
// - the target verifies: the accepted count a is the longest prefix of
//   draft tokens equal to the target's greedy tokens; the target adds one
//   token of its own (the bonus), so the round yields a + 1 tokens and the
//   next one starts a + 1 rows later;
// - tau = tokens yielded / rounds, pooled over every round of every
//   prompt (not averaged per prompt). The first token after the prompt
//   comes from the target's prefill and counts in no round; a round that
//   reaches the continuation's end yields what is left.
//
// The draft's rows at step j are exactly TTT step j's with the draft's own
// tokens fed back instead of the data's: so one pass of K steps over every
// row of a batch (the reference TTT step's attention: step-0 keys <= t and
// the diagonal keys of steps 1..j) gives the chain every round would draft
// from every row; the rounds then only read it. tools/acceptance_crosscheck.py
// measures the same tau the serving way, one token at a time with a KV
// cache.
#ifndef E3_STUDENT_TRAINER_EVAL_ACCEPTANCE_H_
#define E3_STUDENT_TRAINER_EVAL_ACCEPTANCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/parallel_layout.h"
#include "common/torch/torch_core.h"
#include "student_trainer/draft/draft_model.h"
#include "student_trainer/feed/eval_batch.h"

namespace e3 {

class ProcessGroup;

struct AcceptanceCounts {
  int64_t rounds = 0;
  int64_t tokens = 0;  // yielded by the rounds
  double tau() const { return rounds > 0 ? static_cast<double>(tokens) / static_cast<double>(rounds) : 0.0; }
};

// Plays the verify rounds of every sample against its continuation with
// the first `chain_length` tokens of each row's chain.
AcceptanceCounts CountAcceptance(const at::Tensor& chains, const EvalBatch& batch, int64_t chain_length);

struct AcceptanceReport {
  std::vector<int64_t> chain_lengths;   // ascending
  std::vector<AcceptanceCounts> counts;  // one per chain length
  int64_t samples = 0;
  double seconds = 0;
  // "chain 3: tau 1.82 | chain 5: ..." for logs.
  std::string Summary() const;
  double TauAt(int64_t chain_length) const;  // 0 when not measured
};

// The chain lengths reported for --eval_chain=K: 3, 5 and K, those <= K.
std::vector<int64_t> ReportedChainLengths(int64_t chain);

// tau of `draft` over `batches` for each chain length. Under data
// parallelism each rank drafts its share (batch i on rank i % world) and
// the counts are summed over the group, so every rank returns the same.
absl::StatusOr<AcceptanceReport> MeasureAcceptance(DraftModel& draft, const std::vector<EvalBatch>& batches,
                                                   const std::vector<int64_t>& chain_lengths, ProcessGroup* group,
                                                   const ParallelLayout& layout);

}  // namespace e3

#endif  // E3_STUDENT_TRAINER_EVAL_ACCEPTANCE_H_
