// Hand-written matchers for the pre-tokenizer regexes of byte-level BPE
// tokenizers. std::regex has no \p{L}, so each known pattern (recognised by
// its exact text) gets a matcher that reproduces the backtracking regex
// engine HF `tokenizers` uses (Oniguruma): at each position the first
// alternative that can match wins, with greedy quantifiers backtracking as
// the engine would.
#ifndef E3_COMMON_TEXT_PRETOKENIZER_H_
#define E3_COMMON_TEXT_PRETOKENIZER_H_

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace e3 {

enum class SplitPattern {
  // GPT-2's, built into the ByteLevel pre-tokenizer (use_regex=true).
  kGpt2,
  // Llama 3's Split regex: case-insensitive contractions, numbers in
  // groups of up to three digits.
  kLlama3,
  // Qwen2/2.5/3's: as Llama 3, but one digit per piece.
  kQwen2,
};

inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The pattern whose regex text is exactly `regex`, if we know it.
std::optional<SplitPattern> SplitPatternFromRegex(std::string_view regex);

// Splits `text` as HF's Split(pattern, behavior=Isolated) does: every match,
// and every stretch between matches, becomes one piece. Appends the pieces'
// [begin, end) byte ranges, in order, to `pieces`. Invalid UTF-8 bytes are
// taken one at a time, as characters that are neither letters, numbers nor
// spaces. `text` must be shorter than 4 GiB (offsets are kept in 32 bits).
void SplitByPattern(SplitPattern pattern, std::string_view text,
                    std::vector<std::pair<size_t, size_t>>* pieces);

}  // namespace e3

#endif  // E3_COMMON_TEXT_PRETOKENIZER_H_
