// The Split pre-tokenizer of HF tokenizers for any pattern: a regex run by
// Oniguruma (the engine tokenizers itself uses, Debian libonig-dev) or a
// literal string, with each split behaviour (Removed, Isolated,
// MergedWithPrevious, MergedWithNext, Contiguous) and `invert`. The
// patterns of GPT-2, Llama 3 and Qwen2 keep their hand-written matchers
// (common/text/pretokenizer.h), which give the same pieces faster.
#ifndef E3_COMMON_TEXT_REGEX_SPLIT_H_
#define E3_COMMON_TEXT_REGEX_SPLIT_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace e3 {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// "Removed", "Isolated", ... as tokenizer.json writes them; anything else
// is InvalidArgument saying what is expected.
absl::StatusOr<SplitBehavior> SplitBehaviorFromName(const std::string& name);

// A tokenizer.json "pattern" ({"String": s} or {"Regex": r}), as the
// Split pre-tokenizer and the Replace normalizer write it.
struct PatternSpec {
  std::string text;
  bool is_regex = false;
};
// InvalidArgument "is <json>; expected ..." (the caller names the field)
// for anything else, an empty string included.
absl::StatusOr<PatternSpec> PatternFromJson(const nlohmann::json& pattern);

class RegexSplitter {
 public:
  // A regex (Oniguruma, Ruby syntax, UTF-8) or, with is_regex false, a
  // literal. A bad regex is InvalidArgument with Oniguruma's message.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(const std::string& pattern, bool is_regex,
                                                              SplitBehavior behavior, bool invert);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the non-empty pieces' [begin, end) byte ranges of `text`, in
  // order. Text that is not valid UTF-8 is one piece (the engine needs
  // characters; HF's input is always valid).
  void Split(std::string_view text, std::vector<std::pair<size_t, size_t>>* pieces) const;

  // Where the pattern matches in `text`: [begin, end) ranges, as HF's
  // find_matches iterates them (an empty match right after the previous
  // match is skipped one character on).
  void FindMatches(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

 private:
  RegexSplitter() = default;
  void* regex_ = nullptr;  // OnigRegex, or null for a literal
  std::string literal_;
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
  bool invert_ = false;
};

}  // namespace e3

#endif  // E3_COMMON_TEXT_REGEX_SPLIT_H_
