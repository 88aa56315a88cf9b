// The normalizers of a Hugging Face tokenizer.json that byte-level and
// SentencePiece-style BPE models use: NFC, Prepend, Replace (a literal or
// an Oniguruma regex), Strip and Sequence of them. Each keeps, for every
// byte of the text it makes, the original bytes it came from, so token
// offsets point into the caller's text as HF's do. Any other normalizer is
// an error naming the file and the component.
#ifndef E3_COMMON_TEXT_NORMALIZER_H_
#define E3_COMMON_TEXT_NORMALIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace e3 {

using Alignment = std::vector<std::pair<uint32_t, uint32_t>>;

// Text on its way through normalization. `align[i]` is the [begin, end)
// range of the original text that byte i came from; an empty `align` with
// `identity` set means the text is still the original.
struct NormalizedText {
  std::string text;
  Alignment align;
  bool identity = true;

  explicit NormalizedText(std::string_view original) : text(original) {}
  // Gives every byte its own range (for the first change).
  void Materialize();
  // The original range of byte i.
  std::pair<uint32_t, uint32_t> Of(size_t i) const {
    return identity ? std::make_pair(static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)) : align[i];
  }
};

class Normalizer {
 public:
  // tokenizer.json's "normalizer" (null gives null: nothing to do).
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(const std::string& path, const std::string& field,
                                                              const nlohmann::json& config);
  virtual ~Normalizer() = default;
  virtual void Apply(NormalizedText* text) const = 0;
};

}  // namespace e3

#endif  // E3_COMMON_TEXT_NORMALIZER_H_
