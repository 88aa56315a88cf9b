// Greedy generation by the teacher itself, with a KV cache (layers/
// kv_cache.h): prompts are prefilled in batches, then every unfinished
// sequence decodes one token per forward, so a continuation costs one
// token's forward per step instead of its whole prefix's. It serves the
// eval set's ground truth (eval_set.h) and the Generate RPC.
#ifndef E3_TEACHER_SERVER_GENERATION_H_
#define E3_TEACHER_SERVER_GENERATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "teacher_server/causal_lm.h"

namespace e3 {

struct GreedyOptions {
  int64_t max_new_tokens = 256;
  // A generated stop id ends its sequence; it is kept as its last token.
  std::vector<int32_t> stop_ids;
  // Sequences decoded together (one KV cache holds them all).
  int64_t max_sequences = 32;
  // Prompt tokens per prefill forward (at least one whole prompt).
  int64_t prefill_tokens = 8192;
  // Called after each group of sequences finishes: (prompts done, total).
  std::function<void(int64_t, int64_t)> on_progress;
  // Set to stop early; the call then returns Cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

// The greedy continuation of each prompt (without the prompt): the
// model's argmax token after the prompt, then after each token it chose,
// until a stop id or max_new_tokens. Prompts must be non-empty, with ids
// inside the vocabulary. Errors name the prompt.
absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyContinuations(CausalLM& model,
                                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                                      const GreedyOptions& options);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_GENERATION_H_
