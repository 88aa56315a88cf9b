// Token offsets widened to whole characters, for comparing with HF, whose
// offsets count characters: a token holding part of a character (a
// byte-level or byte-fallback token) covers all of it there, only its own
// bytes here.
#ifndef E3_TESTS_COMMON_CHAR_OFFSETS_H_
#define E3_TESTS_COMMON_CHAR_OFFSETS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/text/tokenizer.h"

namespace e3::testing {

inline std::vector<std::pair<size_t, size_t>> CharOffsets(const std::string& text, const Encoding& enc) {
  std::vector<std::pair<size_t, size_t>> out;
  for (auto [b, e] : enc.offsets) {
    while (b > 0 && b < text.size() && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
    while (e < text.size() && (static_cast<uint8_t>(text[e]) & 0xC0) == 0x80) ++e;
    out.emplace_back(b, e);
  }
  return out;
}

}  // namespace e3::testing

#endif  // E3_TESTS_COMMON_CHAR_OFFSETS_H_
