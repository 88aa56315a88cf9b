// Data regeneration (teacher --regenerate): the teacher replaces each
// assistant turn of the training conversations with its own continuation
// of the conversation so far, so the draft learns the target's outputs
// rather than whatever model wrote the data (SpecForge's
// regenerate_train_data.py, ModelOpt's server_generate.py do this offline;
// here the teacher does it itself, batched, with its KV cache).
//
// Turns are regenerated in order: a conversation's k-th assistant turn is
// generated after the k - 1 before it, with those already replaced, and
// all conversations' k-th turns go in one batched generation. The result
// is a training jsonl (conversations with role/content turns; pre-tokenized
// lines copied as they are), written once with a fingerprint of everything
// that defines it beside it (`<cache>.fingerprint`) and reused when a
// restarted teacher computes the same fingerprint.
#ifndef E3_TEACHER_SERVER_DATA_REGENERATE_H_
#define E3_TEACHER_SERVER_DATA_REGENERATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"
#include "teacher_server/models/causal_lm.h"
#include "teacher_server/runtime/generation.h"

namespace e3 {

struct RegenerateOptions {
  // Per assistant turn: max_new_tokens, temperature (0: greedy), seed, the
  // stop ids (the model's EOS), sequences per batch.
  GenerationOptions generation;
  std::string cache_path;  // the regenerated jsonl
  bool skip_malformed = true;
  int64_t max_lines = 0;  // regenerate only the first this many kept lines (0: all), as --max_samples
};

struct RegenerateReport {
  bool reused = false;        // the cache matched; nothing was generated
  int64_t conversations = 0;  // regenerated ones
  int64_t turns = 0;          // assistant turns replaced
  int64_t kept_turns = 0;     // too long to regenerate within the model's positions: kept
  int64_t pretokenized = 0;   // lines copied unchanged
  int64_t malformed = 0;      // lines skipped
  int64_t tokens = 0;         // generated
  double seconds = 0;
  std::string fingerprint;
};

// What defines a regeneration: the data file's bytes, the model directory's
// config, the chat template and the generation settings (hex).
absl::StatusOr<std::string> RegenerationFingerprint(const std::string& data_path, const std::string& model_config_json,
                                                    const std::string& template_fingerprint,
                                                    const GenerationOptions& generation, int64_t max_lines = 0);

// Regenerates `data_path` into options.cache_path, or reuses the cache
// when its fingerprint file holds `fingerprint`.
absl::StatusOr<RegenerateReport> RegenerateData(CausalLM& model, const Tokenizer& tokenizer,
                                                const ChatTemplate& chat_template, const std::string& data_path,
                                                const std::string& fingerprint, const RegenerateOptions& options);

}  // namespace e3

#endif  // E3_TEACHER_SERVER_DATA_REGENERATE_H_
