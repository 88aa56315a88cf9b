// The bits of Unicode the tokenizer and chat templates need: UTF-8
// decoding that never fails, the character classes of the pre-tokenizer
// regexes (\p{L}, \p{N}, \s), and NFC normalization. Tables come from
// tools/gen_unicode_tables.py.
#ifndef E3_COMMON_TEXT_UNICODE_H_
#define E3_COMMON_TEXT_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace e3::unicode {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

struct DecodedChar {
  char32_t cp;
  // Bytes consumed. For invalid input, the maximal ill-formed subpart
  // (at least 1 byte), as Rust's from_utf8_lossy counts it.
  uint32_t len;
  bool valid;
};

// Decodes the character at s[pos] (pos < s.size()). Overlong forms,
// surrogates and values above U+10FFFF are invalid.
DecodedChar DecodeUtf8(std::string_view s, size_t pos);
void AppendUtf8(char32_t cp, std::string* out);
// Replaces each ill-formed subpart with U+FFFD, as Rust's
// String::from_utf8_lossy (what HF decoders return).
std::string ToValidUtf8Lossy(std::string_view bytes);

// \p{L} -> kLetter, \p{N} -> kNumber, White_Space (the \s of Oniguruma and
// Rust regex) -> kSpace.
CharClass ClassOf(char32_t cp);
// Python's str.isspace(): White_Space plus U+001C..U+001F. Jinja's `trim`
// strips these.
bool IsPythonSpace(char32_t cp);

// Whether NFC could change `s` (false for ASCII and most text).
bool MayNeedNfc(std::string_view s);
// NFC of `s`. Invalid UTF-8 bytes pass through unchanged. When `alignment`
// is given it receives, for each output byte, the [begin, end) input bytes
// of the character it came from; a composed character maps to its first
// part, as HF `tokenizers` aligns it.
std::string Nfc(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>* alignment);

}  // namespace e3::unicode

#endif  // E3_COMMON_TEXT_UNICODE_H_
