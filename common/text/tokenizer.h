// BPE tokenizers read from a Hugging Face `tokenizer.json`: byte-level
// (GPT-2, Llama 3, Qwen, DeepSeek-V3, GPT-OSS: Split pre-tokenizers on any
// regex, then ByteLevel) and SentencePiece-style (Llama 2, Mistral, Gemma:
// Prepend/Replace normalizers or Metaspace, byte_fallback, their
// decoders). Encodes and decodes with the same ids as the `tokenizers`
// library; added/special tokens are matched in the raw text before
// normalization, as `tokenizers` does. The post_processor (TemplateProcessing,
// Bert/RobertaProcessing, ByteLevel, Sequence) applies through
// Encode(text, EncodeOptions) and EncodePair. A component it does not know
// is an error naming the file and the field.
#ifndef E3_COMMON_TEXT_TOKENIZER_H_
#define E3_COMMON_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace e3 {

struct Encoding {
  std::vector<int32_t> ids;
  // [begin, end) byte offsets of each token in the encoded text (for a
  // pair, in the text of the token's own sequence, as HF's); (0, 0) for a
  // token the post-processor added.
  std::vector<std::pair<size_t, size_t>> offsets;
};

struct EncodeOptions {
  // HF's add_special_tokens: the post-processor's tokens (a template's BOS,
  // Bert's [CLS]/[SEP], Roberta's <s>/</s>) around the text. False gives
  // HF's add_special_tokens=False, post-processor offsets included.
  bool add_special_tokens = false;
};

class Tokenizer {
 public:
  // Reads tokenizer.json. Unsupported models, pre-tokenizers or regex
  // patterns are errors that name the file and the field.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  virtual ~Tokenizer() = default;

  // Encodes `text` without adding BOS/EOS (like add_special_tokens=False):
  // chat templates put their special tokens in the text themselves, and
  // transformers' apply_chat_template encodes so. The post-processor is not
  // run: where a ByteLevel/Roberta post-processor trims offsets
  // (trim_offsets, GPT-2's), these keep the spaces the tokens carry.
  virtual Encoding Encode(std::string_view text) const = 0;
  // `text` through the model and then the post_processor, as HF's
  // encode(text, add_special_tokens=...): ids and offsets equal HF's
  // (specials at (0, 0); trimmed offsets where the processor trims).
  virtual Encoding Encode(std::string_view text, const EncodeOptions& options) const = 0;
  // HF's encode(a, b, add_special_tokens=...): the post-processor's pair
  // layout. An error when its TemplateProcessing has no pair template.
  virtual absl::StatusOr<Encoding> EncodePair(std::string_view a, std::string_view b,
                                              const EncodeOptions& options) const = 0;
  virtual std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens = false) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual std::optional<std::string> IdToToken(int32_t id) const = 0;
  // Size of the id space: max id + 1 over the vocab and added tokens.
  virtual int64_t vocab_size() const = 0;
};

}  // namespace e3

#endif  // E3_COMMON_TEXT_TOKENIZER_H_
