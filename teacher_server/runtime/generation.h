// Generation by the teacher itself, greedy or sampled, with a KV cache
// (layers/kv_cache.h): prompts are prefilled in batches, then every
// unfinished sequence decodes one token per forward, so a continuation
// costs one token's forward per step instead of its whole prefix's. It
// serves the eval set's ground truth (eval_set.h), data regeneration
// (regenerate.h) and the Generate RPC.
#ifndef E3_TEACHER_SERVER_RUNTIME_GENERATION_H_
#define E3_TEACHER_SERVER_RUNTIME_GENERATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "teacher_server/models/causal_lm.h"

namespace e3 {

struct GenerationOptions {
  int64_t max_new_tokens = 256;
  // A generated stop id ends its sequence; it is kept as its last token.
  std::vector<int32_t> stop_ids;
  // Sequences decoded together (one KV cache holds them all). Prompts are
  // grouped by length, so a group's cache, sized for its longest prompt
  // plus max_new_tokens, wastes little on shorter ones.
  int64_t max_sequences = 32;
  // Also caps a group by its KV cache's bytes (0: no cap beyond
  // max_sequences); a group always takes at least one prompt.
  int64_t kv_cache_bytes = 0;
  // Prompt tokens per prefill forward (at least one whole prompt).
  int64_t prefill_tokens = 8192;
  // Called after each group of sequences finishes: (prompts done, total,
  // tokens generated so far).
  std::function<void(int64_t, int64_t, int64_t)> on_progress;
  // Set to stop early; the call then returns Cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // 0: greedy (the argmax). Above 0: each token is drawn from
  // softmax(logits / temperature), from one generator seeded with `seed`
  // (the same prompts in the same order give the same tokens).
  double temperature = 0;
  uint64_t seed = 0;
};

// The continuation of each prompt (without the prompt): the model's token
// after the prompt (its argmax, or a draw at `temperature`), then after
// each token it chose, until a stop id or max_new_tokens. Prompts must be
// non-empty, with ids inside the vocabulary. Errors name the prompts.
absl::StatusOr<std::vector<std::vector<int32_t>>> GenerateContinuations(CausalLM& model,
                                                                      const std::vector<std::vector<int32_t>>& prompts,
                                                                      const GenerationOptions& options);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_RUNTIME_GENERATION_H_
