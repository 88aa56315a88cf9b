#include "common/text/pretokenizer.h"

#include <algorithm>
#include <cstdint>

#include "common/text/unicode.h"

namespace e3 {
namespace {

using unicode::CharClass;

// Marks an invalid byte: matches no literal in the patterns.
constexpr char32_t kInvalidChar = 0xFFFFFFFF;

struct Char {
  uint32_t offset;  // byte offset in the text
  char32_t cp;
  CharClass cls;
};

bool IsCrLf(char32_t cp) { return cp == '\r' || cp == '\n'; }

// Simple case folding for the letters of the contractions: ASCII, plus
// U+017F LATIN SMALL LETTER LONG S, which folds to 's'.
char32_t FoldContractionLetter(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp - 'A' + 'a';
  if (cp == 0x17F) return 's';
  return cp;
}

class Matcher {
 public:
  Matcher(SplitPattern pattern, const std::vector<Char>& chars)
      : pattern_(pattern), c_(chars), n_(chars.size()) {}

  // End (char index) of the match that starts at char `i`. Every character
  // class is covered by some alternative of the known patterns, so a match
  // always exists and is non-empty.
  size_t MatchAt(size_t i) const {
    return pattern_ == SplitPattern::kGpt2 ? MatchGpt2(i) : MatchLlama3(i);
  }

 private:
  size_t Run(size_t j, CharClass cls) const {
    while (j < n_ && c_[j].cls == cls) ++j;
    return j;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive. 0 if none.
  size_t Contraction(size_t i, bool fold) const {
    if (c_[i].cp != '\'' || i + 1 >= n_) return 0;
    const auto letter = [&](size_t k) { return fold ? FoldContractionLetter(c_[k].cp) : c_[k].cp; };
    const char32_t a = letter(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 >= n_) return 0;
    const char32_t b = letter(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
  }

  // \s+(?!\S)|\s+ at a space: the run, less its last space when a
  // non-space follows and the run has more than one space.
  size_t SpaceRun(size_t i) const {
    const size_t j = Run(i, CharClass::kSpace);
    return (j == n_ || j - i == 1) ? j : j - 1;
  }

  size_t MatchGpt2(size_t i) const {
    if (size_t e = Contraction(i, /*fold=*/false); e != 0) return e;
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: a space joins the run after it.
    if (c_[i].cp == ' ' && i + 1 < n_ && c_[i + 1].cls != CharClass::kSpace) {
      return Run(i + 1, c_[i + 1].cls);
    }
    if (c_[i].cls != CharClass::kSpace) return Run(i, c_[i].cls);
    return SpaceRun(i);
  }

  size_t MatchLlama3(size_t i) const {
    const Char& ch = c_[i];
    if (size_t e = Contraction(i, /*fold=*/true); e != 0) return e;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (ch.cls == CharClass::kLetter) return Run(i, CharClass::kLetter);
    if (ch.cls != CharClass::kNumber && !IsCrLf(ch.cp) && i + 1 < n_ &&
        c_[i + 1].cls == CharClass::kLetter) {
      return Run(i + 1, CharClass::kLetter);
    }
    // \p{N}{1,3} or \p{N}
    if (ch.cls == CharClass::kNumber) {
      const size_t max_digits = pattern_ == SplitPattern::kLlama3 ? 3 : 1;
      return std::min(Run(i, CharClass::kNumber), i + max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    size_t k = i;
    if (ch.cp == ' ' && i + 1 < n_ && c_[i + 1].cls == CharClass::kOther) k = i + 1;
    if (c_[k].cls == CharClass::kOther) {
      size_t j = Run(k, CharClass::kOther);
      while (j < n_ && IsCrLf(c_[j].cp)) ++j;
      return j;
    }
    // `\s*[\r\n]+`: backtracking \s* leaves the match ending just after the
    // last line break of the space run.
    const size_t j = Run(i, CharClass::kSpace);
    for (size_t k2 = j; k2 > i; --k2) {
      if (IsCrLf(c_[k2 - 1].cp)) return k2;
    }
    return SpaceRun(i);
  }

  SplitPattern pattern_;
  const std::vector<Char>& c_;
  size_t n_;
};

}  // namespace

std::optional<SplitPattern> SplitPatternFromRegex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return std::nullopt;
}

void SplitByPattern(SplitPattern pattern, std::string_view text,
                    std::vector<std::pair<size_t, size_t>>* pieces) {
  std::vector<Char> chars;
  chars.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unicode::DecodedChar d = unicode::DecodeUtf8(text, i);
    if (d.valid) {
      chars.push_back({static_cast<uint32_t>(i), d.cp, unicode::ClassOf(d.cp)});
      i += d.len;
    } else {
      chars.push_back({static_cast<uint32_t>(i), kInvalidChar, CharClass::kOther});
      ++i;
    }
  }
  const Matcher matcher(pattern, chars);
  const auto byte_at = [&](size_t k) { return k < chars.size() ? chars[k].offset : text.size(); };
  for (size_t i = 0; i < chars.size();) {
    const size_t end = matcher.MatchAt(i);
    pieces->emplace_back(byte_at(i), byte_at(end));
    i = end;
  }
}

}  // namespace e3
