// The training data reader: chat jsonl or .jsonl.gz (OpenAI "messages",
// "conversations" with role/content or ShareGPT from/value turns; see
// common/text/chat_message.h) tokenized through the model's chat template, or
// pre-tokenized input_ids/loss_mask lines. Bad lines are skipped and counted, or fatal,
// as the options say; either way the error names file:line and what was
// expected.
#ifndef E3_COMMON_DATA_DATASET_H_
#define E3_COMMON_DATA_DATASET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/text/chat_template.h"
#include "common/text/tokenizer.h"

namespace e3 {

struct Sample {
  int64_t id = 0;    // index among the kept samples, in line order
  int64_t line = 0;  // 1-based line of the source file, for messages
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is trained on

  int64_t size() const { return static_cast<int64_t>(input_ids.size()); }
};

// Room for a 128k-token conversation with JSON escapes, several times over.
inline constexpr int64_t kDefaultMaxLineBytes = int64_t{8} << 20;

struct DatasetOptions {
  std::string path;  // .jsonl, or .jsonl.gz
  // true: skip malformed lines, count them and keep the first few messages;
  // false: the first malformed line is an error naming file:line.
  bool skip_malformed = true;
  // Samples longer than this are cut to their first max_length tokens;
  // 0 keeps every sample whole.
  int64_t max_length = 0;
  // Passed to TokenizeChat: train on every token, not only the assistant's.
  bool train_on_all_tokens = false;
  // Samples shorter than this (after the cut) are dropped. Two is the least
  // that trains anything: the draft predicts token t+1 from token t.
  int64_t min_length = 2;
  // Drop samples with no trained token: they cost a forward pass and
  // teach nothing.
  bool drop_empty_loss_mask = true;
  // Stop after this many kept samples; 0 reads the whole file.
  int64_t max_samples = 0;
  // A longer line is counted malformed without being read into memory:
  // parsing, rendering and tokenizing a line costs tens of times its size.
  // 0: no bound.
  int64_t max_line_bytes = kDefaultMaxLineBytes;
  // Bound for pre-tokenized ids; 0 uses the tokenizer's vocab_size.
  int64_t vocab_size = 0;
  // Tokenizer threads; 0 picks from the hardware. Output order never
  // depends on it.
  int num_threads = 0;
  // How many malformed-line messages to keep when skipping.
  int max_error_messages = 5;
  // Read prompts for generation (an eval set) instead of training samples:
  // a conversation's turns up to its last user turn, rendered with the
  // generation prompt; a pre-tokenized line's ids before its last run of
  // trained tokens (all of them when none is trained). No token is
  // trained; set drop_empty_loss_mask = false with it.
  bool prompts_only = false;
};

// Every line read lands in exactly one of empty_lines, malformed,
// dropped_short, dropped_empty_mask or kept.
struct DatasetStats {
  int64_t lines_read = 0;
  int64_t empty_lines = 0;
  int64_t malformed = 0;
  int64_t truncated = 0;  // samples cut to max_length (kept or not)
  int64_t dropped_short = 0;
  int64_t dropped_empty_mask = 0;
  int64_t kept = 0;
  int64_t conversations = 0;  // kept samples that came from chat lines
  int64_t pretokenized = 0;   // kept samples that came as input_ids
  int64_t total_tokens = 0;   // over kept samples, after the cut
  int64_t loss_tokens = 0;    // tokens with loss_mask == 1
  int64_t max_sample_length = 0;
  // Malformed lines by cause ("invalid JSON", "bad turns", "template
  // could not render", ...); the counts sum to `malformed`.
  std::map<std::string, int64_t> malformed_by_cause;
  // "file:line: what", the first max_error_messages malformed lines.
  std::vector<std::string> first_errors;
};

class Dataset {
 public:
  // Missing file: NotFound naming the path. A malformed line with
  // skip_malformed=false: InvalidArgument "path:line: ...".
  static absl::StatusOr<std::unique_ptr<Dataset>> Load(const DatasetOptions& options,
                                                       const Tokenizer& tokenizer,
                                                       const ChatTemplate& chat_template);
  // Wraps samples made elsewhere (tests, regenerated data); ids are
  // renumbered in order and stats recomputed.
  static std::unique_ptr<Dataset> FromSamples(std::vector<Sample> samples,
                                              std::string source = "<memory>");

  const std::vector<Sample>& samples() const { return samples_; }
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  const Sample& operator[](int64_t i) const { return samples_[static_cast<size_t>(i)]; }
  // Token count per sample, indexed by id (what PackBatches takes).
  std::vector<int64_t> Lengths() const;
  const DatasetStats& stats() const { return stats_; }
  const std::string& source() const { return source_; }
  // One line for logs, e.g. "train.jsonl: 3000 lines, 2999 samples kept
  // (1 malformed, ...); 1.2M tokens, 45.0% trained".
  std::string Summary() const;

 private:
  Dataset() = default;
  std::string source_;
  std::vector<Sample> samples_;
  DatasetStats stats_;
};

// What training makes of one line of a data file.
enum class LineOutcome {
  kEmpty,           // blank: skipped
  kMalformed,       // skipped and counted, or fatal (skip_malformed)
  kTooShort,        // fewer than min_length tokens after the cut: dropped
  kNoTrainedToken,  // no loss_mask 1 (drop_empty_loss_mask): dropped
  kKept,            // a sample
};

// One line as Dataset::Load reads it for training (the same parse,
// template rendering, tokenization, cut and drop rules), with what a person
// needs to check it: the rendered text and where each token lies in it.
// teacher_server --preview_data prints these (common/data/preview.h).
struct LinePreview {
  int64_t line = 0;  // 1-based
  LineOutcome outcome = LineOutcome::kEmpty;
  bool conversation = false;  // a chat line; else input_ids/loss_mask (or not parsed)
  std::string error;          // kMalformed: "path:line: what was wrong"
  std::vector<int32_t> input_ids;  // after the cut to max_length
  std::vector<uint8_t> loss_mask;
  int64_t tokens_before_cut = 0;  // more than input_ids.size() when cut
  // A chat line's rendering and the [begin, end) byte span of each of
  // input_ids in it; empty for pre-tokenized lines.
  std::string text;
  std::vector<std::pair<size_t, size_t>> offsets;
  // One per assistant turn whose reasoning (reasoning_content, thinking,
  // or a leading <think> block of its content) the rendering does not
  // contain: the template dropped it.
  std::vector<std::string> warnings;
};

// The first `lines` lines of options.path (blank ones included), each as
// Dataset::Load judges it; max_samples and skip_malformed do not apply.
// Errors: the file cannot be opened or read, bad options.
absl::StatusOr<std::vector<LinePreview>> PreviewLines(const DatasetOptions& options,
                                                      const Tokenizer& tokenizer,
                                                      const ChatTemplate& chat_template,
                                                      int64_t lines);

// One line of a training file, kept as written for regeneration
// (teacher_server/data/regenerate.h): a conversation's turns, or a
// pre-tokenized line's text (messages empty), which cannot be regenerated.
struct ChatLine {
  int64_t line = 0;  // 1-based
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;      // the line's "tools", null when none
  std::string pretokenized;  // the raw JSON of an input_ids/loss_mask line
};

// The kept lines of a jsonl training file, in order. Empty lines are
// skipped; a malformed line is skipped (counted in *malformed) or, with
// skip_malformed false, an error naming path:line.
absl::StatusOr<std::vector<ChatLine>> ReadChatLines(const std::string& path, bool skip_malformed,
                                                    int64_t* malformed);

}  // namespace e3

#endif  // E3_COMMON_DATA_DATASET_H_
