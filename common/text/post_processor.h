// The post-processors of a Hugging Face tokenizer.json: TemplateProcessing,
// BertProcessing, RobertaProcessing, ByteLevel and Sequence of them, applied
// as `tokenizers` applies them. With add_special_tokens they add their
// tokens (offsets (0, 0)); a trimming ByteLevel or RobertaProcessing
// narrows the offsets of tokens that carry spaces whether or not specials
// are added, as HF does. Any other post-processor is an error naming the
// file and the component.
#ifndef E3_COMMON_TEXT_POST_PROCESSOR_H_
#define E3_COMMON_TEXT_POST_PROCESSOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace e3 {

// One sequence on its way through the post-processor: ids, byte offsets,
// and each token's text (what offset trimming reads).
struct PostEncoding {
  std::vector<int32_t> ids;
  std::vector<std::pair<size_t, size_t>> offsets;
  std::vector<std::string> tokens;
};

class PostProcessor {
 public:
  // tokenizer.json's "post_processor" (null gives null: nothing to do).
  static absl::StatusOr<std::unique_ptr<PostProcessor>> FromJson(const std::string& path,
                                                                 const std::string& field,
                                                                 const nlohmann::json& config);
  ~PostProcessor();

  // Whether Process reads PostEncoding::tokens (a step trims offsets).
  bool needs_tokens() const { return needs_tokens_; }
  // Whether a pair can be processed (a TemplateProcessing needs `pair`).
  bool supports_pair() const { return supports_pair_; }
  // The sequences (one, or two for a pair), processed step by step, then
  // concatenated, as HF's PostProcessor::process.
  PostEncoding Process(std::vector<PostEncoding> sequences, bool add_special_tokens) const;

  struct Step;

 private:
  PostProcessor() = default;
  std::vector<Step> steps_;
  bool needs_tokens_ = false;
  bool supports_pair_ = true;
};

}  // namespace e3

#endif  // E3_COMMON_TEXT_POST_PROCESSOR_H_
